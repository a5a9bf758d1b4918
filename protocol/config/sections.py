"""The configuration's value tables: :class:`Section` and the sections of the gateway, store, cache and policies.

Each section is a frozen dataclass that checks its own values when built, naming the key it refuses
(:class:`ConfigError`); the value vocabularies they check against (backends, policies, codecs) live
here too. The storage node's own sections are in :mod:`protocol.config.node`, the root in
:mod:`protocol.config.schema`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass, field

# A gateway reachable from other machines needs real keys: placeholders from the example
# configuration, or secrets shorter than this, are refused there (loopback-only is exempt).
PLACEHOLDER_MARK = "REPLACE_WITH"
MIN_EXPOSED_SECRET_CHARS = 16
STORE_BACKENDS = ("local", "s3")
# cache.policy: which chunks a node evicts (storage_server/store/cache/policy.py).
CACHE_POLICIES = ("lru", "prefix", "reuse")
# storage_server.read_path: how a cold transfer splits the page cache and O_DIRECT (storage_server/read_path.py).
READ_PATHS = ("direct", "planner", "page-cache")
# The allocation policies of ``scheduler.policies`` (the contract names them; a test keeps the two equal).
BANDWIDTH_POLICIES = ("equal", "kv-prop", "bw-prop", "stall-opt", "calibrated-stall-opt")
NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")  # a cluster node id (protocol.cluster)
# The codecs of ``protocol.codecs`` (this package imports nothing of the project; a test keeps the two equal).
CODEC_NAMES = ("none", "zstd", "int8", "int4", "fp8", "int8+zstd", "int4+zstd", "fp8+zstd")
LOSSLESS_CODECS = ("none", "zstd")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")


class ConfigError(ValueError):
    """A configuration problem, naming the offending key."""


class Section:
    """A TOML table: subclasses are frozen dataclasses that check their own values when built."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Refuse bad values through :meth:`require`; a section without constraints keeps this."""

    def require(self, ok: bool, key: str, why: str) -> None:
        if not ok:
            from .schema import TABLES  # the table names come from the root Config, built from these sections
            table = TABLES.get(type(self), type(self).__name__)
            raise ConfigError(f"{table}.{key}: {why}" if table else f"{key}: {why}")


@dataclass(frozen=True)
class Tenant(Section):
    name: str
    access_key: str
    secret_key: str
    # Bandwidth pool: this tenant's cap (0 = none) and its weight in the allocation.
    bandwidth_cap_gbps: float = 0.0
    weight: float = 1.0
    # Bytes of KV chunks this tenant may hold on a node (0 = cache.tenant_max_bytes).
    cache_max_bytes: int = 0
    # Who owns this tenant's buckets in the store's records ("" = derived, see owner_id); set it to
    # the old owner_id to keep a tenant's buckets when its access key is rotated.
    id: str = ""

    @property
    def owner_id(self) -> str:
        """The tenant as bucket ownership records name it: ``id`` if set, else ``<name>~`` and a digest of
        its access key (never of the secret), so two tenants of one name with other keys (two nodes'
        generated ``dev`` tenants, or two unshared tenant lists) never own each other's buckets."""
        return self.id or f"{self.name}~{hashlib.sha256(b'objectcache-owner:' + self.access_key.encode()).hexdigest()[:20]}"

    def validate(self) -> None:
        for key in ("name", "access_key", "secret_key"):
            self.require(bool(getattr(self, key)), key, f"must not be empty (tenant {self.name!r})")
        self.require(self.bandwidth_cap_gbps >= 0, "bandwidth_cap_gbps", f"must be >= 0 (tenant {self.name!r})")
        self.require(self.weight > 0, "weight", f"must be > 0 (tenant {self.name!r})")
        self.require(self.cache_max_bytes >= 0, "cache_max_bytes", f"must be >= 0 (tenant {self.name!r}; 0 = cache.tenant_max_bytes)")


@dataclass(frozen=True)
class GatewayConfig(Section):
    host: str = "127.0.0.1"
    port: int = 9000
    region: str = "us-east-1"
    # CreateBucket location constraints accepted as meaning ``region`` (e.g. "default", which
    # Ceph-style clients and test suites send); any other constraint is InvalidLocationConstraint.
    region_aliases: tuple[str, ...] = ()
    # Host-name suffixes for virtual-hosted-style addressing (bucket.<domain>).
    domains: tuple[str, ...] = ("localhost",)
    max_clock_skew_s: float = 900.0
    # Most keys one listing page returns (S3's own cap is 1000).
    max_list_keys: int = 1000
    # Largest kv-put batch body the gateway accepts.
    kv_max_put_bytes: int = 256 * 1024 * 1024
    # A request's headers must arrive within this long of the connection opening or of the
    # previous response (an idle keep-alive connection closes then too).
    header_timeout_s: float = 30.0
    # While a request body is read, the client may stay silent this long (then 400 RequestTimeout).
    body_timeout_s: float = 60.0
    # Open client connections at once; more are answered 503 and closed. Also bounded by half
    # the process's file-descriptor limit.
    max_connections: int = 4096
    # On SIGTERM: /ready turns 503, the listener closes, and requests in flight get this long to finish.
    drain_timeout_s: float = 30.0

    def validate(self) -> None:
        self.require(0 <= self.port <= 65535, "port", f"{self.port} is not a TCP port (0..65535)")
        self.require(self.drain_timeout_s >= 0, "drain_timeout_s", "must be >= 0")
        self.require(self.header_timeout_s > 0, "header_timeout_s", "must be positive")
        self.require(self.body_timeout_s > 0, "body_timeout_s", "must be positive")
        self.require(self.max_connections >= 1, "max_connections", "must be at least 1")
        self.require(self.max_clock_skew_s > 0, "max_clock_skew_s", "must be positive")
        self.require(1 <= self.max_list_keys <= 1000, "max_list_keys", "must be in 1..1000")
        self.require(self.kv_max_put_bytes >= 1, "kv_max_put_bytes", "must be positive")


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # "" (every interface) or a host name: reachable from elsewhere


@dataclass(frozen=True)
class LocalStoreConfig(Section):
    """``[store.local]``: settings only the local-disk backend reads."""

    # Blocking-I/O pool of the local-disk store, per process.
    io_threads: int = 16

    def validate(self) -> None:
        self.require(self.io_threads >= 1, "io_threads", "must be at least 1")


@dataclass(frozen=True)
class S3StoreConfig(Section):
    """``[store.s3]``: the upstream S3-compatible store the ``s3`` backend fronts."""

    # Empty means AWS's own endpoint for ``region``.
    endpoint_url: str = ""
    region: str = "us-east-1"
    # Empty keys fall back to the usual AWS credential chain (environment, profile, instance role).
    access_key: str = ""
    secret_key: str = ""
    # Pooled connections to the upstream, per process.
    max_connections: int = 64
    # Attempts per upstream request (exponential backoff with jitter between them); then 503.
    max_attempts: int = 3
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    # Bodies above this go upstream as a multipart upload of parts this size (bounds memory per stream);
    # also the largest part a client may send (aws-cli and boto3 send 8 MiB parts).
    part_bytes: int = 8 * 1024 * 1024
    # How long a process may answer ownership questions from a bucket record it read (the
    # record decides who owns a bucket and which incarnation it is). 0: read it on every
    # request, so a bucket deleted and recreated by another tenant through another node is
    # never served from the old record; above 0 that window is the staleness accepted.
    bucket_record_ttl_s: float = 0.0
    # Upstream buckets that exist without ObjectCache's record and that a tenant may claim
    # with CreateBucket, as "bucket:tenant" entries; any other such bucket is refused
    # (BucketAlreadyExists), so no tenant can take over what is already in the upstream.
    adopt_buckets: tuple[str, ...] = ()

    @property
    def adoptions(self) -> dict[str, str]:
        """``adopt_buckets`` as bucket -> the tenant that may claim it."""
        return dict(entry.split(":", 1) for entry in self.adopt_buckets)  # type: ignore[misc]

    def validate(self) -> None:
        self.require(self.bucket_record_ttl_s >= 0, "bucket_record_ttl_s", "must be >= 0")
        for entry in self.adopt_buckets:
            bucket, _, tenant = entry.partition(":")
            self.require(bool(bucket) and bool(tenant), "adopt_buckets", f"{entry!r} is not \"bucket:tenant\"")
        self.require(len({e.partition(":")[0] for e in self.adopt_buckets}) == len(self.adopt_buckets), "adopt_buckets",
                     "names a bucket twice")
        self.require(self.max_connections >= 1, "max_connections", "must be at least 1")
        self.require(self.max_attempts >= 1, "max_attempts", "must be at least 1")
        self.require(self.connect_timeout_s > 0, "connect_timeout_s", "must be positive")
        self.require(self.read_timeout_s > 0, "read_timeout_s", "must be positive")
        self.require(5 * 1024 * 1024 <= self.part_bytes <= 5 * 1024**3, "part_bytes", "must be within S3's part sizes (5 MiB..5 GiB)")
        self.require(bool(self.access_key) == bool(self.secret_key), "secret_key", "access_key and secret_key go together")


@dataclass(frozen=True)
class StoreConfig(Section):
    backend: str = "local"
    # The local-disk store's directory; also where the RPC socket and dev credentials live
    # (and, with the s3 backend, the chunk cache).
    data_dir: str = "./data"
    local: LocalStoreConfig = field(default_factory=LocalStoreConfig)
    s3: S3StoreConfig = field(default_factory=S3StoreConfig)

    def validate(self) -> None:
        self.require(self.backend in STORE_BACKENDS, "backend",
                     f"unknown backend {self.backend!r} (supported: {', '.join(STORE_BACKENDS)})")


@dataclass(frozen=True)
class CacheConfig(Section):
    """KV chunk bytes one node keeps: the s3 backend's local chunk cache, the local backend's chunk objects."""

    # Bytes of chunk data kept on this node (metadata not counted); least recently used
    # chunks that no transfer has pinned go first, tails of a prefix before its head.
    max_bytes: int = 100 * 1024**3
    # Chunks one kv-get fetches from the upstream at once (s3 backend).
    fetch_concurrency: int = 16
    # s3 backend: a cached chunk not confirmed for this long is checked against the upstream
    # (one HEAD, its ETag) before a kv-get serves it, so a chunk deleted or replaced through
    # another node is served from a stale copy at most this long. 0: checked at every kv-get.
    revalidate_after_s: float = 60.0
    # Which chunk goes when room is needed: "reuse" (the leaf of the cached prefix trees least
    # likely to be used again, odds learnt online per kind of chunk; at or above LRU on every
    # trace replayed), "lru", or "prefix" (a fixed worth: hits, the conversation it continues,
    # depth, recency; below LRU on Mooncake's public conversation trace).
    policy: str = "reuse"
    # Bytes of chunks one tenant may hold on this node (0 = no per-tenant bound; a tenant's
    # own cache_max_bytes overrides it): a tenant at its bound evicts its own chunks first.
    tenant_max_bytes: int = 0
    # Bytes of chunks one tenant may soft-pin (kv-put with x-oc-soft-pin-ttl: kept through any
    # eviction until the TTL ends, e.g. a system prompt). 0 = soft pins are refused.
    soft_pin_tenant_max_bytes: int = 0
    # The longest TTL a soft pin may ask for.
    soft_pin_max_ttl_s: float = 3600.0

    def validate(self) -> None:
        self.require(self.soft_pin_tenant_max_bytes >= 0, "soft_pin_tenant_max_bytes", "must be >= 0 (0 = soft pins refused)")
        self.require(self.soft_pin_max_ttl_s > 0, "soft_pin_max_ttl_s", "must be > 0")
        self.require(self.policy in CACHE_POLICIES, "policy", f"unknown policy {self.policy!r} (supported: {', '.join(CACHE_POLICIES)})")
        self.require(self.tenant_max_bytes >= 0, "tenant_max_bytes", "must be >= 0 (0 = no per-tenant bound)")
        self.require(self.revalidate_after_s >= 0, "revalidate_after_s", "must be >= 0 (0 = checked at every kv-get)")
        self.require(self.max_bytes >= 1, "max_bytes", "must be at least 1")
        self.require(self.fetch_concurrency >= 1, "fetch_concurrency", "must be at least 1")


@dataclass(frozen=True)
class BandwidthConfig(Section):
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

    def validate(self) -> None:
        self.require(self.policy in BANDWIDTH_POLICIES, "policy", f"{self.policy!r} is not one of {', '.join(BANDWIDTH_POLICIES)}")
        self.require(self.capacity_gbps >= 0, "capacity_gbps", "must be >= 0")
        self.require(self.margin_gbps >= 0, "margin_gbps", "must be >= 0")
        self.require(self.epoch_ms > 0, "epoch_ms", "must be > 0")
        self.require(self.dispatch_slots >= 1, "dispatch_slots", "must be at least 1")
        self.require(self.burst_layers >= 0, "burst_layers", "must be >= 0")
        self.require(self.default_compute_per_layer_s >= 0, "default_compute_per_layer_s", "must be >= 0")


# Decoded copies by default: a 16K-token Llama 3.1 8B prefix is 2 GiB raw; 2% of the default 100 GiB cache.
DEFAULT_DECODED_COPIES_BYTES = 2 << 30


@dataclass(frozen=True)
class CompressionConfig(Section):
    """``[compression]``: which codecs a kv-put may store compressed chunks with (``protocol.codecs``)."""

    # Codecs every bucket accepts; lossy ones listed here are accepted everywhere. Lossless only by default.
    allowed_codecs: tuple[str, ...] = LOSSLESS_CODECS
    # Buckets that also accept every lossy codec (int8, int4, fp8 and their "+zstd" forms): KV read
    # from them is approximate, within each codec's stated bound.
    lossy_buckets: tuple[str, ...] = ()
    # "bucket:codec" entries: the node stores the raw chunks of a kv-put into that bucket with that codec,
    # when the kv-put states the chunks' shape (the SDK does whenever it is given a float layout).
    bucket_codecs: tuple[str, ...] = ()
    # The node's decode pipeline (fetch on storage_server.read_threads, then these two stages, each its own
    # pool) over pieces of about piece_bytes decoded bytes; slots in flight = the three pools' workers.
    decompress_threads: int = 2
    dequantise_threads: int = 2
    piece_bytes: int = 1 << 20
    # Bytes of raw copies of compressed chunks the node decoded (storage_server.decoded_copies): a warm kv-get the
    # node would decode reads the copy instead, gathered like a raw chunk (on a link faster than the decoder, a
    # compressed prefix then loads as fast as a raw one). -1 (the default): DEFAULT_DECODED_COPIES_BYTES, at most a
    # quarter of cache.max_bytes; 0: none, every kv-get the node serves decodes. Nothing is copied unless chunks are
    # stored compressed.
    decoded_copies_bytes: int = -1
    # Within that budget, also decode each compressed chunk a kv-put stores into a copy right after the put, on a
    # nice-19 thread: the chunk's first kv-get on a fast link then reads a copy, not the decoder. Such copies never
    # evict a copy a kv-get read (storage_server.copy_eviction). Local-disk stores only (a capacity tier's node
    # copies what its kv-gets decode).
    decode_on_put: bool = True
    # Within that budget, a capacity tier's node decodes each compressed chunk it fetches from the upstream layer by
    # layer while it streams in (storage_server.stream_decode): the decode overlaps the upstream link, and the cold
    # kv-get that fetched it reads the copy instead of decoding after the fetch.
    decode_on_fetch: bool = True

    def copies_budget(self, cache_max_bytes: int) -> int:
        """The decoded copies' bytes on a node whose cache holds ``cache_max_bytes`` (see ``decoded_copies_bytes``)."""
        if self.decoded_copies_bytes >= 0:
            return self.decoded_copies_bytes
        return min(DEFAULT_DECODED_COPIES_BYTES, cache_max_bytes // 4)

    def codec_for(self, bucket: str) -> str:
        """The codec the node applies to raw kv-put chunks of ``bucket`` ("none": stored as they are)."""
        return dict(e.split(":", 1) for e in self.bucket_codecs).get(bucket, "none")  # type: ignore[misc]

    def allows(self, bucket: str, codec: str) -> bool:
        return codec in self.allowed_codecs or codec in LOSSLESS_CODECS or (bucket in self.lossy_buckets and codec in CODEC_NAMES)

    def validate(self) -> None:
        for name in self.allowed_codecs:
            self.require(name in CODEC_NAMES, "allowed_codecs", f"unknown codec {name!r} (known: {', '.join(CODEC_NAMES)})")
        for entry in self.bucket_codecs:
            bucket, _, codec = entry.partition(":")
            self.require(bool(bucket) and codec in CODEC_NAMES, "bucket_codecs", f"{entry!r} is not \"bucket:codec\" with a known codec")
            self.require(self.allows(bucket, codec), "bucket_codecs",
                         f"{entry!r}: {codec!r} is lossy and {bucket!r} is not in compression.lossy_buckets")
        self.require(len({e.partition(":")[0] for e in self.bucket_codecs}) == len(self.bucket_codecs), "bucket_codecs", "names a bucket twice")
        self.require(self.decompress_threads >= 1, "decompress_threads", "must be at least 1")
        self.require(self.dequantise_threads >= 1, "dequantise_threads", "must be at least 1")
        self.require(self.piece_bytes >= 4096, "piece_bytes", "must be at least 4096")
        self.require(self.decoded_copies_bytes >= -1, "decoded_copies_bytes", "must be at least -1 (-1: the default budget, 0: no decoded copies)")


@dataclass(frozen=True)
class LogConfig(Section):
    """Logging of every process; ``OBJECTCACHE_LOG_LEVEL=DEBUG`` is the usual way to set it."""

    level: str = "WARNING"
    # "text" for people, "json" (one object per line) for log shippers.
    format: str = "text"
    # One line per request (gateway) and per finished kv-get (storage server), whatever ``level`` is.
    access: bool = True

    def validate(self) -> None:
        self.require(self.level.upper() in LOG_LEVELS, "level", f"{self.level!r} is not one of {', '.join(LOG_LEVELS)}")
        self.require(self.format in LOG_FORMATS, "format", f"{self.format!r} is not one of {', '.join(LOG_FORMATS)}")


@dataclass(frozen=True)
class MetricsConfig(Section):
    """Prometheus listeners, one per process, apart from the S3 port (scrapes need no signature: keep them private)."""

    host: str = "127.0.0.1"
    # 0 = no listener.
    gateway_port: int = 0
    storage_server_port: int = 0

    def validate(self) -> None:
        for key in ("gateway_port", "storage_server_port"):
            port = getattr(self, key)
            self.require(0 <= port <= 65535, key, f"{port} is not a TCP port (1..65535, or 0 for none)")
