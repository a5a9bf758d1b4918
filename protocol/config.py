"""Deployment configuration: one TOML file plus ``OBJECTCACHE_*`` environment overrides.

Every section is a dataclass; unknown keys and bad values are refused at
start-up with a message naming them (``ConfigError``). Environment variables
override single values: ``OBJECTCACHE_<SECTION>_<KEY>`` (e.g.
``OBJECTCACHE_GATEWAY_PORT=9100``), and ``OBJECTCACHE_TENANTS`` replaces the
tenant list with ``name:access_key:secret_key`` entries separated by commas.
"""

from __future__ import annotations

import os
import secrets
import tomllib
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

ENV_PREFIX = "OBJECTCACHE_"
# The allocation policies of ``scheduler.policies`` (the contract names them; a test keeps the two equal).
STORE_BACKENDS = ("local",)
BANDWIDTH_POLICIES = ("equal", "kv-prop", "bw-prop", "stall-opt", "calibrated-stall-opt")


class ConfigError(ValueError):
    """A configuration problem, naming the offending key."""


@dataclass(frozen=True)
class Tenant:
    name: str
    access_key: str
    secret_key: str
    # Bandwidth pool: this tenant's cap (0 = none) and its weight in the allocation.
    bandwidth_cap_gbps: float = 0.0
    weight: float = 1.0


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 9000
    region: str = "us-east-1"
    # Host-name suffixes for virtual-hosted-style addressing (bucket.<domain>).
    domains: tuple[str, ...] = ("localhost",)
    max_clock_skew_s: float = 900.0
    max_keys: int = 1000
    # Largest kv-put batch body the gateway accepts.
    kv_max_put_bytes: int = 256 * 1024 * 1024


@dataclass(frozen=True)
class StoreConfig:
    backend: str = "local"
    data_dir: str = "./data"
    io_threads: int = 16


@dataclass(frozen=True)
class StorageServerConfig:
    # Unix socket for gateway -> daemon RPC; empty means <data_dir>/storage-server.sock.
    socket: str = ""
    # Alternatively "host:port" for TCP.
    tcp: str = ""
    # Bounded read pool for KV range reads (the GIL is released during preadv); 0 = one
    # per CPU core. Warm-cache reads are memory-bound copies, and more threads than cores
    # only contend (measured: 2 threads 6.5 GB/s, 8 threads 3-4 GB/s on 2 cores); raise it
    # for stores whose chunks mostly come from disk, where reads wait on I/O.
    io_threads: int = 0
    # Mode threshold Θ (paper eq. 2): payloads below it go chunkwise, others layerwise.
    # 32 MiB moves in ~3 ms at 10 GB/s, about one layer of prefill compute for a
    # short miss on an A100: below that, per-layer notifications and pacing cost
    # more than the overlap can win.
    theta_bytes: int = 32 * 1024 * 1024
    # Most chunk keys one descriptor may name (64K tokens at G=16 is 4,096).
    max_keys: int = 65536
    # Chunk files kept open between transfers (a 64K-token prefix at G=16 is 3,584 files,
    # ~13 ms to open and close); 0 opens them per transfer. Bounded by half the
    # process's file limit. Deleted objects' fds are closed within housekeeping_s.
    open_files: int = 8192
    # Bytes all http transfers together may stage in the daemon's memory (two layers each
    # layerwise, the whole payload chunkwise); transfers wait for room. A chunkwise
    # request bigger than this is sent layerwise instead.
    http_staging_bytes: int = 1 << 30
    # Registered shm regions with no transfer for this long are dropped (a crashed
    # client never unregisters); the SDK re-registers transparently.
    region_idle_s: float = 600.0
    # How often cached fds of deleted objects are closed and idle regions expire.
    housekeeping_s: float = 10.0


@dataclass(frozen=True)
class BandwidthConfig:
    """The shared pool for layerwise transfers (DESIGN §6). capacity_gbps = 0 disables pacing."""

    capacity_gbps: float = 0.0
    policy: str = "calibrated-stall-opt"
    margin_gbps: float = 5.0
    epoch_ms: float = 10.0
    # Layer reads dispatched at once across all paced transfers (weighted DRR order).
    dispatch_slots: int = 2
    # Layers a transfer may send ahead of its rate (token-bucket burst).
    burst_layers: int = 1
    # Without a compute window in the descriptor, a request is assumed to have this much
    # compute per layer (0: nothing to hide behind, the most urgent).
    default_compute_per_layer_s: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.capacity_gbps > 0


@dataclass(frozen=True)
class Config:
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    storage_server: StorageServerConfig = field(default_factory=StorageServerConfig)
    bandwidth: BandwidthConfig = field(default_factory=BandwidthConfig)
    tenants: tuple[Tenant, ...] = ()

    @property
    def data_dir(self) -> Path:
        return Path(self.store.data_dir).resolve()

    @property
    def rpc_socket(self) -> Path:
        return Path(self.storage_server.socket) if self.storage_server.socket else self.data_dir / "storage-server.sock"


SECTIONS: dict[str, type] = {"gateway": GatewayConfig, "store": StoreConfig, "storage_server": StorageServerConfig, "bandwidth": BandwidthConfig}


def _coerce(where: str, typ: Any, value: Any) -> Any:
    t = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    try:
        if t in ("bool", bool):
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                return value.lower() in ("1", "true", "yes", "on")
            raise ValueError
        if t in ("int", int):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if t in ("float", float):
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if t in ("str", str):
            if not isinstance(value, str):
                raise ValueError
            return value
        if str(t).startswith("tuple[str"):
            if isinstance(value, str):
                value = [v for v in value.split(",") if v]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError
            return tuple(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: bad value {value!r} (expected {t})") from None
    raise ConfigError(f"{where}: unsupported type {t}")


def _section(name: str, cls: type, raw: dict[str, Any]) -> Any:
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(f"unknown key(s) in [{name}]: {', '.join(unknown)} (known: {', '.join(known)})")
    missing = [k for k, f in known.items() if f.default is MISSING and f.default_factory is MISSING and k not in raw]
    if missing:
        raise ConfigError(f"[{name}] is missing required key(s): {', '.join(missing)}")
    values = {k: _coerce(f"{name}.{k}", known[k].type, v) for k, v in raw.items()}
    return cls(**values)


def _validate(cfg: Config) -> None:
    if not 0 <= cfg.gateway.port <= 65535:
        raise ConfigError(f"gateway.port: {cfg.gateway.port} is not a TCP port (0..65535)")
    if cfg.gateway.max_clock_skew_s <= 0:
        raise ConfigError("gateway.max_clock_skew_s must be positive")
    if not 1 <= cfg.gateway.max_keys <= 1000:
        raise ConfigError("gateway.max_keys must be in 1..1000")
    if cfg.store.backend not in STORE_BACKENDS:
        raise ConfigError(f"store.backend: unknown backend {cfg.store.backend!r} (supported: {', '.join(STORE_BACKENDS)})")
    if cfg.store.io_threads < 1:
        raise ConfigError("store.io_threads must be at least 1")
    if cfg.storage_server.io_threads < 0:
        raise ConfigError("storage_server.io_threads must be >= 0 (0 = one per CPU core)")
    if cfg.storage_server.theta_bytes < 0:
        raise ConfigError("storage_server.theta_bytes must be non-negative")
    if cfg.storage_server.open_files < 0:
        raise ConfigError("storage_server.open_files must be >= 0 (0 = no open-file cache)")
    if cfg.storage_server.http_staging_bytes < 1:
        raise ConfigError("storage_server.http_staging_bytes must be at least 1")
    if not cfg.storage_server.region_idle_s > 0:
        raise ConfigError("storage_server.region_idle_s must be > 0")
    if not cfg.storage_server.housekeeping_s > 0:
        raise ConfigError("storage_server.housekeeping_s must be > 0")
    if cfg.storage_server.max_keys < 1:
        raise ConfigError("storage_server.max_keys must be at least 1")
    if cfg.gateway.kv_max_put_bytes < 1:
        raise ConfigError("gateway.kv_max_put_bytes must be positive")
    bw = cfg.bandwidth
    if bw.policy not in BANDWIDTH_POLICIES:
        raise ConfigError(f"bandwidth.policy: {bw.policy!r} is not one of {', '.join(BANDWIDTH_POLICIES)}")
    if bw.capacity_gbps < 0 or bw.margin_gbps < 0 or bw.epoch_ms <= 0 or bw.dispatch_slots < 1 or bw.burst_layers < 0:
        raise ConfigError("bandwidth: capacity_gbps and margin_gbps must be >= 0, epoch_ms > 0, dispatch_slots >= 1, burst_layers >= 0")
    if bw.default_compute_per_layer_s < 0:
        raise ConfigError("bandwidth.default_compute_per_layer_s must be >= 0")
    seen: set[str] = set()
    for t in cfg.tenants:
        if t.bandwidth_cap_gbps < 0 or t.weight <= 0:
            raise ConfigError(f"tenants: {t.name!r} needs bandwidth_cap_gbps >= 0 and weight > 0")
        for attr in ("name", "access_key", "secret_key"):
            if not getattr(t, attr):
                raise ConfigError(f"tenants: {attr} must not be empty (tenant {t.name!r})")
        if t.access_key in seen:
            raise ConfigError(f"tenants: access_key {t.access_key!r} is used twice")
        seen.add(t.access_key)


def parse_tenants(raw: Any, where: str = "tenants") -> tuple[Tenant, ...]:
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: expected an array of tables ([[tenants]])")
    out = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict):
            raise ConfigError(f"{where}[{i}]: expected a table")
        out.append(_section(f"{where}[{i}]", Tenant, t))
    return tuple(out)


def load_config(path: str | os.PathLike | None = None, env: dict[str, str] | None = None, **overrides: Any) -> Config:
    """Read TOML (if given), apply environment, then explicit overrides (``section__key=value``)."""
    env = dict(os.environ if env is None else env)
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: invalid TOML: {e}") from None
    unknown = sorted(set(raw) - set(SECTIONS) - {"tenants"})
    if unknown:
        raise ConfigError(f"unknown section(s): {', '.join(unknown)} (known: {', '.join([*SECTIONS, 'tenants'])})")
    sections: dict[str, dict[str, Any]] = {}
    for name in SECTIONS:
        value = raw.get(name, {})
        if not isinstance(value, dict):
            raise ConfigError(f"[{name}] must be a table")
        sections[name] = dict(value)
    for name, cls in SECTIONS.items():
        for f in fields(cls):
            var = f"{ENV_PREFIX}{name.upper()}_{f.name.upper()}"
            if var in env:
                sections[name][f.name] = env[var]
    for k, v in overrides.items():
        if v is None:
            continue
        section, _, key = k.partition("__")
        sections[section][key] = v
    tenants = parse_tenants(raw.get("tenants", []))
    if f"{ENV_PREFIX}TENANTS" in env:
        entries = [e for e in env[f"{ENV_PREFIX}TENANTS"].split(",") if e]
        parsed = []
        for e in entries:
            parts = e.split(":")
            if len(parts) != 3:
                raise ConfigError(f"{ENV_PREFIX}TENANTS: entry {e.split(':')[0]!r} is not name:access_key:secret_key")
            parsed.append(Tenant(*parts))
        tenants = tuple(parsed)
    cfg = Config(**{n: _section(n, SECTIONS[n], sections[n]) for n in SECTIONS}, tenants=tenants)
    _validate(cfg)
    return cfg


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
