"""Deployment configuration: one TOML file plus ``OBJECTCACHE_*`` environment overrides.

The schema is a tree of frozen dataclasses (:class:`Section`). A field whose type is a
section is a TOML sub-table (``[store.local]``), ``tenants`` is an array of tables, every
other field is one value. Each section checks its own values when it is built, so no
invalid ``Config`` can exist; :class:`Config` checks only what spans sections.

Environment variable names are generated from the schema,
``OBJECTCACHE_<SECTION>[_<SUBTABLE>]_<KEY>`` (``OBJECTCACHE_GATEWAY_PORT=9100``,
``OBJECTCACHE_STORE_LOCAL_IO_THREADS=8``), and ``OBJECTCACHE_TENANTS`` replaces the
tenant list with ``name:access_key:secret_key`` entries separated by commas. Unknown
keys, unknown ``OBJECTCACHE_*`` variables and bad values are refused at start-up with a
message naming them (``ConfigError``): a misspelt override would otherwise be ignored.

Every process reads this package, so it imports nothing of the project and writes no files. Its
modules: :mod:`.sections` (the base :class:`Section` and the gateway, store, cache and policy
tables), :mod:`.node` (``[storage_server]`` and ``[cluster]``), :mod:`.schema` (the root
:class:`Config`, table and variable names), :mod:`.load` (:func:`load_config`); import from here.
"""

from .load import RENAMED, load_config
from .node import PATH_CHOICES, RDMA_ENGINES, ClusterConfig, StorageServerConfig
from .schema import ENV_PREFIX, ENV_VARS, TABLES, Config, KeyPath, env_name
from .sections import (
    BANDWIDTH_POLICIES,
    CACHE_POLICIES,
    CODEC_NAMES,
    LOG_FORMATS,
    LOG_LEVELS,
    LOSSLESS_CODECS,
    MIN_EXPOSED_SECRET_CHARS,
    NODE_ID,
    PLACEHOLDER_MARK,
    READ_PATHS,
    STORE_BACKENDS,
    BandwidthConfig,
    CacheConfig,
    CompressionConfig,
    ConfigError,
    GatewayConfig,
    LocalStoreConfig,
    LogConfig,
    MetricsConfig,
    S3StoreConfig,
    Section,
    StoreConfig,
    Tenant,
    is_loopback,
)

__all__ = [
    "BANDWIDTH_POLICIES", "CACHE_POLICIES", "CODEC_NAMES", "ENV_PREFIX", "ENV_VARS", "LOG_FORMATS", "LOG_LEVELS",
    "LOSSLESS_CODECS", "MIN_EXPOSED_SECRET_CHARS", "NODE_ID", "PATH_CHOICES", "PLACEHOLDER_MARK", "RDMA_ENGINES",
    "READ_PATHS", "RENAMED", "STORE_BACKENDS", "TABLES", "BandwidthConfig", "CacheConfig", "ClusterConfig",
    "CompressionConfig", "Config", "ConfigError", "GatewayConfig", "KeyPath", "LocalStoreConfig", "LogConfig",
    "MetricsConfig", "S3StoreConfig", "Section", "StorageServerConfig", "StoreConfig", "Tenant", "env_name",
    "is_loopback", "load_config",
]
