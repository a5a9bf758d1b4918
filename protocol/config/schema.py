"""The root :class:`Config` and what is derived from walking the schema: table names and ``OBJECTCACHE_*`` names.

Walking the dataclasses (not a hand-kept list) is what makes every key overridable from the
environment and every error name its table.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

from .node import ClusterConfig, StorageServerConfig
from .sections import (
    MIN_EXPOSED_SECRET_CHARS,
    PLACEHOLDER_MARK,
    BandwidthConfig,
    CacheConfig,
    CompressionConfig,
    GatewayConfig,
    LogConfig,
    MetricsConfig,
    Section,
    StoreConfig,
    Tenant,
    is_loopback,
)

ENV_PREFIX = "OBJECTCACHE_"


@dataclass(frozen=True)
class Config(Section):
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    storage_server: StorageServerConfig = field(default_factory=StorageServerConfig)
    bandwidth: BandwidthConfig = field(default_factory=BandwidthConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    log: LogConfig = field(default_factory=LogConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    tenants: tuple[Tenant, ...] = ()
    # A TOML file of [[tenants]] (nothing else) that every node of a cluster reads, so all agree on
    # who owns what; instead of [[tenants]] here. OBJECTCACHE_TENANTS still replaces the list.
    tenants_file: str = ""

    @property
    def data_dir(self) -> Path:
        return Path(self.store.data_dir).resolve()

    @property
    def rpc_socket(self) -> Path:
        return Path(self.storage_server.socket) if self.storage_server.socket else self.data_dir / "storage-server.sock"

    def validate(self) -> None:
        """The checks that span sections (each section checked its own values)."""
        self.require(not self.cluster.enabled or self.store.backend == "s3", "cluster",
                     "nodes share caches in front of one upstream: cluster.node_id needs store.backend = \"s3\"")
        seen: set[str] = set()
        for t in self.tenants:
            self.require(t.access_key not in seen, "tenants", f"access_key {t.access_key!r} is used twice")
            seen.add(t.access_key)
        if not is_loopback(self.gateway.host):
            exposed = f"gateway.host = {self.gateway.host!r} listens beyond this machine"
            for t in self.tenants:
                for key in ("access_key", "secret_key"):
                    self.require(PLACEHOLDER_MARK not in getattr(t, key), "tenants",
                                 f"tenant {t.name!r}: {key} is the placeholder {getattr(t, key)!r} and {exposed}; "
                                 "generate real keys (e.g. `openssl rand -base64 30`)")
                self.require(len(t.secret_key) >= MIN_EXPOSED_SECRET_CHARS, "tenants",
                             f"tenant {t.name!r}: secret_key is {len(t.secret_key)} characters and {exposed}; "
                             f"use at least {MIN_EXPOSED_SECRET_CHARS} (e.g. `openssl rand -base64 30`)")


# --- The schema, walked: table names and environment variable names come from the dataclasses.

KeyPath = tuple[str, ...]


@cache
def hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def table_type(tp: Any) -> type[Section] | None:
    return tp if isinstance(tp, type) and issubclass(tp, Section) else None


def array_type(tp: Any) -> type[Section] | None:
    """The element type of an array of tables (``tuple[Tenant, ...]``), else None."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return table_type(args[0])
    return None


def _walk(cls: type, path: KeyPath = ()) -> Iterator[tuple[KeyPath, Any]]:
    """Every key of the schema, depth first, with its path and type."""
    for f in fields(cls):
        tp = hints(cls)[f.name]
        yield (*path, f.name), tp
        if sub := table_type(tp):
            yield from _walk(sub, (*path, f.name))


def env_name(path: KeyPath) -> str:
    return ENV_PREFIX + "_".join(path).upper()


def _env_vars() -> dict[str, KeyPath]:
    out: dict[str, KeyPath] = {}
    for path, tp in _walk(Config):
        if table_type(tp):
            continue
        name = env_name(path)
        if name in out:  # e.g. a key store.local_io_threads beside the table store.local
            raise RuntimeError(f"{'.'.join(path)} and {'.'.join(out[name])} both map to {name}")
        out[name] = path
    return out


# Section class -> its dotted table name ("" for the root); element types of arrays are named after the array.
TABLES: dict[type, str] = {Config: ""} | {
    t: ".".join(path) for path, tp in _walk(Config) if (t := table_type(tp) or array_type(tp))
}
# Every environment variable the schema reads -> the key path it sets.
ENV_VARS: dict[str, KeyPath] = _env_vars()
