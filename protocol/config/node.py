"""The storage node's sections: ``[storage_server]`` (RPC, read path, staging, regions, data endpoint, rdma)
and ``[cluster]`` (peers, membership, path choice, the delivery-time oracle's tier map).

The largest two tables of the schema, and the ones only the storage server reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .sections import MIN_EXPOSED_SECRET_CHARS, NODE_ID, PLACEHOLDER_MARK, READ_PATHS, Section, is_loopback

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
    # Page-cache layers of a cold transfer asked ahead (fadvise WILLNEED) of the layer being read, at least this
    # many bytes (two layers at least); layer 0 is asked for alone first. 0 = all of them at once.
    read_ahead_window_bytes: int = 8 << 20
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
        self.require(self.read_ahead_window_bytes >= 0, "read_ahead_window_bytes", "must be >= 0 (0 = every page-cache layer at once)")
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
