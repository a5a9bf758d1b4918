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

Every process reads this module, so it imports nothing of the project and writes no files.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import os
import re
import tomllib
import typing
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

ENV_PREFIX = "OBJECTCACHE_"
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
# The codecs of ``protocol.codecs`` (this module imports nothing of the project; a test keeps the two equal).
CODEC_NAMES = ("none", "zstd", "int8", "int4", "fp8", "int8+zstd", "int4+zstd", "fp8+zstd")
LOSSLESS_CODECS = ("none", "zstd")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")
# Keys renamed since earlier releases: an old config is refused with a pointer to the new name.
RENAMED = {
    "gateway.max_keys": "gateway.max_list_keys",
    "store.io_threads": "store.local.io_threads",
    "storage_server.io_threads": "storage_server.read_threads",
    "storage_server.max_keys": "storage_server.max_descriptor_keys",
}


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


RDMA_ENGINES = ("nixl", "pyverbs")


@dataclass(frozen=True)
class StorageServerConfig(Section):
    # Unix socket for gateway -> daemon RPC; empty means <data_dir>/storage-server.sock.
    socket: str = ""
    # Alternatively "host:port" for TCP. A TCP listener admits only peers that prove they hold the
    # shared key below (a challenge-response per connection, protocol.rpc_auth); beyond loopback it
    # refuses to start without one.
    tcp: str = ""
    # The TCP RPC's shared key, the same on the gateway and the storage server: a file holding it
    # (readable only by the service user; preferred) or the key itself (e.g. from the environment,
    # OBJECTCACHE_STORAGE_SERVER_RPC_KEY). At least 16 bytes: `openssl rand -base64 32`.
    rpc_key_file: str = ""
    rpc_key: str = ""
    # Bounded read pool for KV range reads (the GIL is released during preadv); 0 = one
    # per CPU core. Warm-cache reads are memory-bound copies, and more threads than cores
    # only contend (measured: 2 threads 6.5 GB/s, 8 threads 3-4 GB/s on 2 cores); raise it
    # for stores whose chunks mostly come from disk, where reads wait on I/O.
    read_threads: int = 0
    # Reads in flight for a cold transfer: when most sampled chunks are not in the page cache,
    # a layerwise transfer into the client's memory (shm) reads several layers of each chunk
    # per request with O_DIRECT, this many at once, as a disk wants a deep queue; its chunks
    # are then read into the page cache in the background, within half of the available
    # memory, for the next fetch. 0: cold chunks are read through the page cache.
    cold_read_depth: int = 16
    # How a cold transfer (sampled chunks mostly not in the page cache) is read, all transfers
    # sharing one page-cache budget (MemAvailable and the memory cgroup's limit less its anon and
    # shmem): "direct" (O_DIRECT where it can land, then read into the page cache in the background
    # within the budget), "planner" (Dual-Blade: layers 0..n1-1 through the page cache while the
    # budget allows, the rest O_DIRECT) or "page-cache" (every layer through it, read ahead within the budget).
    read_path: str = "direct"
    # At most this many bytes of that page-cache budget (0 = as MemAvailable and the memory cgroup allow),
    # e.g. on a node whose memory other services need.
    page_cache_max_bytes: int = 0
    # Mode threshold Θ (paper eq. 2): payloads below it go chunkwise, others layerwise.
    # 32 MiB moves in ~3 ms at 10 GB/s, about one layer of prefill compute for a
    # short miss on an A100: below that, per-layer notifications and pacing cost
    # more than the overlap can win.
    theta_bytes: int = 32 * 1024 * 1024
    # Most chunk keys one descriptor may name (64K tokens at G=16 is 4,096).
    max_descriptor_keys: int = 65536
    # Chunk files kept open between transfers (a 64K-token prefix at G=16 is 3,584 files,
    # ~13 ms to open and close); 0 opens them per transfer. Bounded by half the
    # process's file limit. Deleted objects' fds are closed within housekeeping_s.
    open_files: int = 8192
    # Bytes all http transfers together may stage in the daemon's memory (two layers each
    # layerwise, the whole payload chunkwise); transfers wait for room. A chunkwise
    # request bigger than this is sent layerwise instead.
    http_staging_bytes: int = 1 << 30
    # The part of http_staging_bytes one tenant's transfers may hold together (0 < share <= 1): one
    # tenant cannot take the whole budget from the others.
    http_staging_tenant_share: float = 0.5
    # A kv-get whose receiver (the client, or the gateway relaying to it) takes no bytes for this long
    # is cut off and releases its staging memory.
    send_stall_s: float = 30.0
    # Registered shm regions with no transfer for this long are dropped (a crashed
    # client never unregisters); the SDK re-registers transparently.
    region_idle_s: float = 600.0
    # Registered regions (shm and rdma) one tenant may have; at the cap its least recently used
    # idle one is dropped (503 when all are in use). Also bounds the client NIXL agents the
    # server knows for the tenant: an agent is forgotten with its last region.
    max_regions_per_tenant: int = 64
    # Bytes of registered shm regions one tenant may have populated (``"populate": true``):
    # the server faults those pages in itself, so they count against its memory.
    populate_max_bytes: int = 32 << 30
    # Declared bytes of shm regions (registered or with a ticket) one tenant, and all tenants
    # together, may have: each takes its whole size of the server's address space (128 TiB on
    # x86-64) however little of it is resident, so sparse memfds could exhaust it. A tenant's
    # own idle regions are dropped to make room; beyond that a registration is refused (503).
    shm_max_bytes_per_tenant: int = 1 << 40
    shm_max_bytes: int = 1 << 44
    # How often cached fds of deleted objects are closed and idle regions expire.
    housekeeping_s: float = 10.0
    # A multipart upload neither completed nor aborted this long after it began is aborted by
    # housekeeping (S3's AbortIncompleteMultipartUpload for every bucket): an upload cut off by
    # Ctrl-C or a crashed client otherwise keeps its parts for ever. 0 = never.
    abort_incomplete_uploads_s: float = 7 * 86400.0
    # On SIGTERM the RPC socket closes and kv-gets in flight get this long to finish.
    drain_timeout_s: float = 30.0
    # The direct data path of http kv-gets ("host:port"; port 0 = any free one): the gateway
    # authenticates the kv-get and hands the client a short-lived ticket for this endpoint,
    # which then streams the frames itself, without the gateway's relay hop (half the
    # socket copies). Empty: every byte is relayed by the gateway.
    data_listen: str = ""
    # The address clients are told to connect to ("host:port"), when it is not data_listen's
    # own (a wildcard bind, another host's view, NAT); empty: data_listen with its bound port.
    data_endpoint: str = ""
    # How long a data ticket stays valid (it is also good for one kv-get only).
    data_ticket_ttl_s: float = 30.0
    # Data endpoint connections open at once (more are refused and closed; also at most a quarter
    # of the process's file-descriptor limit), and how long one may take to send its request.
    data_max_connections: int = 1024
    data_request_timeout_s: float = 10.0
    # The local fast path (protocol.session): how long a session capability lasts, and how many one
    # tenant may hold (at the cap its oldest is dropped); 0 sessions turns the fast path off.
    session_ttl_s: float = 3600.0
    max_sessions_per_tenant: int = 64

    # The rdma transport's engine: "nixl" (NIXL over UCX: verbs where a device exists, CMA/TCP
    # otherwise; pip install nixl) or "pyverbs" (rdma-core's verbs directly: one RC queue pair per
    # registration, WRITE_WITH_IMM as the layer notification; needs an RDMA device and pyverbs).
    rdma_engine: str = "nixl"
    # pyverbs: the RDMA device to open (ibv_devices lists them); empty = the first one.
    rdma_device: str = ""
    # Longest one RDMA write into a client's memory may take (one piece of at most 8 MiB, or a
    # chunkwise payload of at most http_staging_bytes): a client that never completes it (gone,
    # or metadata pointing at something that never answers) costs its transfer this long, then
    # the transfer fails 503 and the region must be registered again. Also bounds the READ of a
    # nixl registration's proof (metadata that leads nowhere is refused after this long).
    rdma_timeout_s: float = 30.0

    def validate(self) -> None:
        self.require(self.rdma_engine in RDMA_ENGINES, "rdma_engine", f"must be one of {', '.join(RDMA_ENGINES)}")
        self.require(not (self.rpc_key and self.rpc_key_file), "rpc_key", "rpc_key and rpc_key_file are both set; set one")
        self.require(not self.rpc_key or len(self.rpc_key.strip().encode()) >= MIN_EXPOSED_SECRET_CHARS, "rpc_key",
                     f"must be at least {MIN_EXPOSED_SECRET_CHARS} bytes (e.g. `openssl rand -base64 32`)")
        tcp_host = self.tcp.rpartition(":")[0].strip("[]")
        self.require(not self.tcp or is_loopback(tcp_host) or bool(self.rpc_key or self.rpc_key_file), "tcp",
                     f"{self.tcp!r} listens beyond this machine without authentication: set storage_server.rpc_key_file "
                     "(or rpc_key) on the storage server and the gateway")
        for name in ("data_listen", "data_endpoint"):
            value = getattr(self, name)
            host, _, port = value.rpartition(":")
            self.require(not value or (bool(host) and port.isdigit() and int(port) < 65536), name, 'must be "host:port" (or empty)')
        wildcard = self.data_listen.rpartition(":")[0].strip("[]") in ("0.0.0.0", "::")
        self.require(not wildcard or bool(self.data_endpoint), "data_endpoint",
                     "must name the address clients connect to when data_listen binds a wildcard address")
        self.require(self.data_ticket_ttl_s > 0, "data_ticket_ttl_s", "must be > 0")
        self.require(self.data_max_connections >= 1, "data_max_connections", "must be at least 1")
        self.require(self.data_request_timeout_s > 0, "data_request_timeout_s", "must be > 0")
        self.require(self.session_ttl_s > 0, "session_ttl_s", "must be > 0")
        self.require(self.max_sessions_per_tenant >= 0, "max_sessions_per_tenant", "must be >= 0 (0 = no local fast path)")
        self.require(self.read_threads >= 0, "read_threads", "must be >= 0 (0 = one per CPU core)")
        self.require(0 <= self.cold_read_depth <= 256, "cold_read_depth", "must be 0 (off) to 256")
        self.require(self.page_cache_max_bytes >= 0, "page_cache_max_bytes", "must be >= 0 (0 = from MemAvailable and the cgroup)")
        self.require(self.read_path in READ_PATHS, "read_path", f"unknown {self.read_path!r} (supported: {', '.join(READ_PATHS)})")
        self.require(self.theta_bytes >= 0, "theta_bytes", "must be non-negative")
        self.require(self.max_descriptor_keys >= 1, "max_descriptor_keys", "must be at least 1")
        self.require(self.open_files >= 0, "open_files", "must be >= 0 (0 = no open-file cache)")
        self.require(self.http_staging_bytes >= 1, "http_staging_bytes", "must be at least 1")
        self.require(0 < self.http_staging_tenant_share <= 1, "http_staging_tenant_share", "must be in (0, 1]")
        self.require(self.send_stall_s > 0, "send_stall_s", "must be > 0")
        self.require(self.region_idle_s > 0, "region_idle_s", "must be > 0")
        self.require(self.rdma_timeout_s > 0, "rdma_timeout_s", "must be > 0")
        self.require(self.max_regions_per_tenant >= 1, "max_regions_per_tenant", "must be >= 1")
        self.require(self.populate_max_bytes >= 0, "populate_max_bytes", "must be >= 0 (0 = populate refused)")
        self.require(self.shm_max_bytes_per_tenant >= 0, "shm_max_bytes_per_tenant", "must be >= 0 (0 = shm refused)")
        self.require(self.shm_max_bytes >= 0, "shm_max_bytes", "must be >= 0 (0 = shm refused)")
        self.require(self.housekeeping_s > 0, "housekeeping_s", "must be > 0")
        self.require(self.abort_incomplete_uploads_s >= 0, "abort_incomplete_uploads_s", "must be >= 0 (0 = never)")
        self.require(self.drain_timeout_s >= 0, "drain_timeout_s", "must be >= 0")


PATH_CHOICES = ("scheduler", "peer-first", "upstream")


@dataclass(frozen=True)
class ClusterConfig(Section):
    """Nodes that share their caches (s3 backend): peers fetch each other's warm chunks instead of the upstream."""

    # This node's id in the cluster (letters, digits, '.', '_', '-'); empty: no cluster, the node is an island.
    node_id: str = ""
    # The peer listener ("host:port", port 0 = any free one) other nodes call with the cluster key.
    listen: str = ""
    # The address peers are told to connect to, when it is not listen's own (a wildcard bind, NAT).
    advertise: str = ""
    # Topology labels (Kubernetes: topology.kubernetes.io/zone, a rack label, the node name):
    # a peer nearer by these labels is preferred when several hold the same chunks.
    zone: str = ""
    rack: str = ""
    host: str = ""
    # The secret every node of the cluster shares and no tenant holds (at least 32 characters).
    key: str = ""
    # Static peers, "node_id=host:port" each.
    peers: tuple[str, ...] = ()
    # Membership through the upstream store: an upstream bucket where each node keeps a heartbeat
    # record under ObjectCache's reserved prefix (created if missing); empty: static peers only.
    registry_bucket: str = ""
    # How often a node writes its heartbeat (and reads the others'); a node whose record has not
    # changed for missed_heartbeats intervals is gone.
    heartbeat_s: float = 2.0
    missed_heartbeats: int = 3
    # Deadline of the batched "which leading chunks do you hold" fan-out; a peer slower than this counts as holding none.
    lookup_timeout_s: float = 0.25
    # A peer stream that delivers no chunk for this long (or breaks) fails over to the next path.
    peer_timeout_s: float = 5.0
    # Peer streams one kv-get runs at once (its range from a peer is split between them).
    fetch_concurrency: int = 4
    # How long a grant this node signs for a peer stays valid.
    grant_ttl_s: float = 30.0
    # Bytes per second this node sends to peers at most (0: unlimited), so peers never crowd its own clients.
    serve_max_bytes_per_s: float = 0.0
    # Other nodes' upstream links (and caches) a kv-get's cold chunks may also come through, beside this
    # node's own (DualPath's second storage path): the path scheduler may use up to this many + 2 sources
    # at once (a peer's warm front, then the cold rest shared so the shares finish together).
    # 0: every cold chunk comes through this node.
    cold_split_peers: int = 0
    # Peer -> engine: an http kv-get (asked for the direct data path) whose chunks this node lacks and one peer
    # holds whole is answered with a ticket for that peer's data endpoint (storage_server.data_listen there), so
    # the client streams it from the peer; an rdma kv-get (NIXL engine) is written by that peer straight into the
    # engine's registered memory (peer-write). The chunks do not enter this node's cache. false: through this node.
    direct_from_peers: bool = False
    # How a kv-get's chunks missing here are fetched: "scheduler" (the path scheduler picks the path or split
    # that minimises the predicted TTFT), "peer-first" (no choice: the peer holding the longest warm run, then
    # the upstream through this node; the baseline bench cluster compares with), "upstream" (peers are never
    # asked for a kv-get's chunks; kv-estimate and serving peers still work).
    path_choice: str = "scheduler"
    # Peer -> engine over rdma: a kv-get is cut by chunk ranges into this many + 1 parts written at once by as many
    # nodes (this node among them when it holds the prefix itself; peers that hold it whole). 0: one writer.
    direct_split_peers: int = 0
    # A failed peer-write's remaining layers are taken over once the peer confirmed its writes stopped (it closes),
    # or after this long without an answer (a stalled peer then finds the fence before its next write step).
    fence_timeout_s: float = 5.0
    # The delivery-time oracle (kv-estimate, and each kv-get's prediction): configured bandwidth (Gbit/s) and one-way
    # latency (microseconds) per tier of the static tier map, from the topology labels above (NetKV's tier map).
    same_host_gbps: float = 200.0
    same_rack_gbps: float = 100.0
    same_zone_gbps: float = 50.0
    cross_zone_gbps: float = 25.0
    same_host_latency_us: float = 2.0
    same_rack_latency_us: float = 5.0
    same_zone_latency_us: float = 10.0
    cross_zone_latency_us: float = 25.0
    # The upstream store as a source: its bandwidth into one node and its first-byte time.
    upstream_gbps: float = 10.0
    upstream_first_byte_ms: float = 20.0
    # GETs the upstream store serves at once for all nodes together (0: no shared limit, each node's link is its own);
    # a small store (one moto, one SeaweedFS volume server) makes splitting a cold miss over nodes gain nothing.
    upstream_store_streams: int = 0
    # How often measured per-link rates are folded into their EWMA (weight rate_ewma_alpha for the newest sample);
    # measurements older than estimate_stale_after_s are ignored (the configured tier map alone).
    estimate_refresh_s: float = 1.0
    rate_ewma_alpha: float = 0.3
    estimate_stale_after_s: float = 30.0

    @property
    def enabled(self) -> bool:
        return bool(self.node_id)

    def static_peers(self) -> list[tuple[str, str]]:
        return [(p.partition("=")[0], p.partition("=")[2]) for p in self.peers]

    def validate(self) -> None:
        self.require(not self.node_id or NODE_ID.match(self.node_id) is not None, "node_id",
                     "must be 1-63 letters, digits, '.', '_' or '-'")
        for name in ("listen", "advertise"):
            host, _, port = getattr(self, name).rpartition(":")
            self.require(not getattr(self, name) or (bool(host) and port.isdigit() and int(port) < 65536), name, 'must be "host:port"')
        if self.enabled:
            self.require(bool(self.listen), "listen", "must be set when node_id is (the peer listener)")
            self.require(len(self.key) >= 32, "key", "must be at least 32 characters when node_id is set (e.g. `openssl rand -base64 33`)")
            self.require(PLACEHOLDER_MARK not in self.key, "key", "is the example's placeholder; generate one (e.g. `openssl rand -base64 33`)")
            wildcard = self.listen.rpartition(":")[0].strip("[]") in ("0.0.0.0", "::")
            self.require(not wildcard or bool(self.advertise), "advertise", "must be set when listen binds a wildcard address")
        for p in self.peers:
            node, _, addr = p.partition("=")
            host, _, port = addr.rpartition(":")
            self.require(NODE_ID.match(node) is not None and bool(host) and port.isdigit(), "peers", f'{p!r} is not "node_id=host:port"')
        self.require(self.heartbeat_s > 0, "heartbeat_s", "must be > 0")
        self.require(self.missed_heartbeats >= 1, "missed_heartbeats", "must be at least 1")
        self.require(self.lookup_timeout_s > 0, "lookup_timeout_s", "must be > 0")
        self.require(self.peer_timeout_s > 0, "peer_timeout_s", "must be > 0")
        self.require(self.fetch_concurrency >= 1, "fetch_concurrency", "must be at least 1")
        self.require(self.grant_ttl_s > 0, "grant_ttl_s", "must be > 0")
        self.require(self.cold_split_peers >= 0, "cold_split_peers", "must be >= 0 (0 = no split)")
        self.require(self.path_choice in PATH_CHOICES, "path_choice", f"must be one of {', '.join(PATH_CHOICES)}")
        self.require(self.direct_split_peers >= 0, "direct_split_peers", "must be >= 0 (0 = one writer)")
        self.require(self.fence_timeout_s > 0, "fence_timeout_s", "must be > 0")
        self.require(self.serve_max_bytes_per_s >= 0, "serve_max_bytes_per_s", "must be >= 0 (0 = unlimited)")
        for tier in ("same_host", "same_rack", "same_zone", "cross_zone"):
            self.require(0 < getattr(self, f"{tier}_gbps") < math.inf, f"{tier}_gbps", "must be > 0 and finite")
            self.require(0 <= getattr(self, f"{tier}_latency_us") < math.inf, f"{tier}_latency_us", "must be >= 0 and finite")
        self.require(0 < self.upstream_gbps < math.inf, "upstream_gbps", "must be > 0 and finite")
        self.require(0 <= self.upstream_first_byte_ms < math.inf, "upstream_first_byte_ms", "must be >= 0 and finite")
        self.require(self.upstream_store_streams >= 0, "upstream_store_streams", "must be >= 0 (0 = no shared limit)")
        self.require(self.estimate_refresh_s > 0, "estimate_refresh_s", "must be > 0")
        self.require(0 < self.rate_ewma_alpha <= 1, "rate_ewma_alpha", "must be in (0, 1]")
        self.require(self.estimate_stale_after_s > 0, "estimate_stale_after_s", "must be > 0")


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
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _table_type(tp: Any) -> type[Section] | None:
    return tp if isinstance(tp, type) and issubclass(tp, Section) else None


def _array_type(tp: Any) -> type[Section] | None:
    """The element type of an array of tables (``tuple[Tenant, ...]``), else None."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _table_type(args[0])
    return None


def _walk(cls: type, path: KeyPath = ()) -> Iterator[tuple[KeyPath, Any]]:
    """Every key of the schema, depth first, with its path and type."""
    for f in fields(cls):
        tp = _hints(cls)[f.name]
        yield (*path, f.name), tp
        if sub := _table_type(tp):
            yield from _walk(sub, (*path, f.name))


def env_name(path: KeyPath) -> str:
    return ENV_PREFIX + "_".join(path).upper()


def _env_vars() -> dict[str, KeyPath]:
    out: dict[str, KeyPath] = {}
    for path, tp in _walk(Config):
        if _table_type(tp):
            continue
        name = env_name(path)
        if name in out:  # e.g. a key store.local_io_threads beside the table store.local
            raise RuntimeError(f"{'.'.join(path)} and {'.'.join(out[name])} both map to {name}")
        out[name] = path
    return out


# Section class -> its dotted table name ("" for the root); element types of arrays are named after the array.
TABLES: dict[type, str] = {Config: ""} | {
    t: ".".join(path) for path, tp in _walk(Config) if (t := _table_type(tp) or _array_type(tp))
}
# Every environment variable the schema reads -> the key path it sets.
ENV_VARS: dict[str, KeyPath] = _env_vars()


# --- Loading.

def _coerce(where: str, tp: Any, value: Any) -> Any:
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                return value.lower() in ("1", "true", "yes", "on")
            raise ValueError
        if tp is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if tp is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if tp is str:
            if not isinstance(value, str):
                raise ValueError
            return value
        if tp == tuple[str, ...]:
            if isinstance(value, str):
                value = [v for v in value.split(",") if v]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError
            return tuple(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: bad value {value!r} (expected {tp.__name__ if isinstance(tp, type) else tp})") from None
    raise ConfigError(f"{where}: unsupported type {tp}")


def _renamed(dotted: str) -> str:
    return f" (renamed to {RENAMED[dotted]})" if dotted in RENAMED else ""


def _table(cls: type[Section], path: KeyPath, raw: Any) -> Any:
    """Build one table from its raw TOML value, sub-tables and arrays of tables included."""
    where = ".".join(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"[{where}] must be a table")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown and not path:
        raise ConfigError(f"unknown section(s): {', '.join(unknown)} (known: {', '.join(known)})")
    if unknown:
        names = ", ".join(f"{where}.{k}{_renamed(f'{where}.{k}')}" for k in unknown)
        raise ConfigError(f"unknown key(s) in [{where}]: {names} (known: {', '.join(known)})")
    missing = [k for k, f in known.items() if f.default is MISSING and f.default_factory is MISSING and k not in raw]
    if missing:
        raise ConfigError(f"[{where}] is missing required key(s): {', '.join(missing)}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        tp = _hints(cls)[key]
        if sub := _table_type(tp):
            values[key] = _table(sub, (*path, key), value)
        elif elem := _array_type(tp):
            if not isinstance(value, list):
                raise ConfigError(f"{key}: expected an array of tables ([[{key}]])")
            values[key] = tuple(_table(elem, (*path, f"{key}[{i}]"), v) for i, v in enumerate(value))
        else:
            values[key] = _coerce(".".join((*path, key)), tp, value)
    return cls(**values)


def _env_value(var: str, path: KeyPath, text: str) -> Any:
    """An override's raw value; an array of tables takes entries of its required keys joined by ':'."""
    elem = _array_type(_hints(Config).get(path[0])) if len(path) == 1 else None
    if elem is None:
        return text
    required = [f.name for f in fields(elem) if f.default is MISSING and f.default_factory is MISSING]
    entries = []
    for entry in filter(None, text.split(",")):
        parts = entry.split(":")
        if len(parts) != len(required):
            raise ConfigError(f"{var}: entry {parts[0]!r} is not {':'.join(required)}")
        entries.append(dict(zip(required, parts, strict=True)))
    return entries


def _set(raw: dict[str, Any], path: KeyPath, value: Any) -> None:
    node = raw
    for i, key in enumerate(path[:-1]):
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"[{'.'.join(path[:i + 1])}] must be a table")
    node[path[-1]] = value


def _env_path(var: str) -> KeyPath:
    if var in ENV_VARS:
        return ENV_VARS[var]
    old = {env_name(tuple(k.split("."))): env_name(tuple(v.split("."))) for k, v in RENAMED.items()}
    hint = f" (renamed to {old[var]})" if var in old else ""
    raise ConfigError(f"unknown environment variable {var}{hint} (known: {', '.join(ENV_VARS)})")


def load_config(path: str | os.PathLike | None = None, env: Mapping[str, str] | None = None, **overrides: Any) -> Config:
    """Read TOML (if given), apply environment, then explicit overrides (``section__key=value``, None skipped)."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = _read_toml(path) if path is not None else {}
    inline_tenants = "tenants" in raw
    for var in sorted(v for v in env if v.startswith(ENV_PREFIX)):
        key_path = _env_path(var)
        _set(raw, key_path, _env_value(var, key_path, env[var]))
    for key, value in overrides.items():
        if value is not None:
            _set(raw, tuple(key.split("__")), value)
    tenants_file = raw.get("tenants_file")
    if tenants_file and env_name(("tenants",)) not in env:  # OBJECTCACHE_TENANTS replaces the list wherever it came from
        if inline_tenants:
            raise ConfigError("tenants: give [[tenants]] or tenants_file, not both")
        shared = _read_toml(tenants_file)
        if not isinstance(shared, dict) or set(shared) - {"tenants"}:
            raise ConfigError(f"tenants_file {tenants_file}: holds only [[tenants]] (found: {', '.join(sorted(set(shared) - {'tenants'}))})")
        raw["tenants"] = shared.get("tenants", [])
    return _table(Config, (), raw)


def _read_toml(path: str | os.PathLike) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
