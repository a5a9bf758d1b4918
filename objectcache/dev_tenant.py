"""The development tenant ``objectcache serve`` uses when the configuration names none.

It lives in the CLI, not in ``protocol.config``: loading a configuration must not write
files, and only the commands that serve requests need the keys.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import replace

from protocol.config import Config, Tenant

DEV_CREDENTIALS_FILE = "dev-credentials.env"


def with_dev_tenant(cfg: Config) -> tuple[Config, Tenant | None]:
    """With no tenants configured, use one development tenant.

    Its keys are generated once per data directory and kept in
    ``<data_dir>/dev-credentials.env`` (mode 0600), a shell file that also sets
    the region and endpoint, so ``source data/dev-credentials.env`` configures
    aws-cli and boto3.
    """
    if cfg.tenants:
        return cfg, None
    path = cfg.data_dir / DEV_CREDENTIALS_FILE
    values: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.startswith("export ") and "=" in line:
                k, _, v = line[len("export "):].partition("=")
                values[k] = v.strip("'\"")
    ak = values.get("AWS_ACCESS_KEY_ID") or "OC" + secrets.token_hex(9).upper()
    sk = values.get("AWS_SECRET_ACCESS_KEY") or secrets.token_urlsafe(30)
    tenant = Tenant("dev", ak, sk)
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    host = "127.0.0.1" if cfg.gateway.host in ("0.0.0.0", "::", "") else cfg.gateway.host
    text = (
        f"export AWS_ACCESS_KEY_ID={ak}\n"
        f"export AWS_SECRET_ACCESS_KEY={sk}\n"
        f"export AWS_DEFAULT_REGION={cfg.gateway.region}\n"
        f"export AWS_ENDPOINT_URL=http://{host}:{cfg.gateway.port}\n"
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return replace(cfg, tenants=(tenant,)), tenant
