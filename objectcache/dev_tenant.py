"""The development tenant ``objectcache serve`` uses when the configuration names none.

It lives in the CLI, not in ``protocol.config``: loading a configuration must not write
files, and only the commands that serve requests need the keys.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import replace

from protocol.config import Config, Tenant

DEV_CREDENTIALS_FILE = "dev-credentials.env"


def _read(path) -> dict[str, str]:
    values: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.startswith("export ") and "=" in line:
                k, _, v = line[len("export "):].partition("=")
                values[k] = v.strip("'\"")
    return values


def endpoint_url(host: str, port: int) -> str:
    """The URL a client on this host uses for a gateway listening on ``host:port``."""
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def write_dev_credentials(cfg: Config, tenant: Tenant, port: int) -> None:
    """(Re)write ``<data_dir>/dev-credentials.env`` (mode 0600, replaced atomically) once ``port`` is bound."""
    path = cfg.data_dir / DEV_CREDENTIALS_FILE
    lines = [
        f"export AWS_ACCESS_KEY_ID={tenant.access_key}",
        f"export AWS_SECRET_ACCESS_KEY={tenant.secret_key}",
        f"export AWS_DEFAULT_REGION={cfg.gateway.region}",
        f"export AWS_ENDPOINT_URL={endpoint_url(cfg.gateway.host, port)}",
    ]
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


def dev_tenant_name(cfg: Config, access_key: str) -> str:
    """``dev`` on the local backend (one node, its own data directory); on the s3 backend, whose
    upstream other nodes share, ``dev-`` and a digest of the access key, so each node's generated
    tenant is told apart by name too (ownership records name the owner id, which differs anyway;
    records written before owner ids named the tenant only)."""
    if cfg.store.backend == "local":
        return "dev"
    return "dev-" + hashlib.sha256(access_key.encode()).hexdigest()[:16]


def recorded_dev_tenant(cfg: Config) -> Tenant | None:
    """The development tenant ``<data_dir>/dev-credentials.env`` records, if any."""
    values = _read(cfg.data_dir / DEV_CREDENTIALS_FILE)
    ak, sk = values.get("AWS_ACCESS_KEY_ID"), values.get("AWS_SECRET_ACCESS_KEY")
    return Tenant(dev_tenant_name(cfg, ak), ak, sk) if ak and sk else None


def with_dev_tenant(cfg: Config) -> tuple[Config, Tenant | None]:
    """With no tenants configured, use one development tenant.

    Its keys are generated once per data directory and kept in
    ``<data_dir>/dev-credentials.env`` (mode 0600), a shell file that also sets
    the region and endpoint, so ``source data/dev-credentials.env`` configures
    aws-cli and boto3. Nothing is written here: the gateway writes the file once it
    has bound its port (:func:`write_dev_credentials`), so a gateway that cannot
    listen leaves no file naming a port nobody serves.
    """
    if cfg.tenants:
        return cfg, None
    ak = "OC" + secrets.token_hex(9).upper()
    tenant = recorded_dev_tenant(cfg) or Tenant(dev_tenant_name(cfg, ak), ak, secrets.token_urlsafe(30))
    return replace(cfg, tenants=(tenant,)), tenant
