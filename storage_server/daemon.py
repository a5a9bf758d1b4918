"""The storage-server daemon: owns the store and the chunk source, answers the gateway's RPC.

The RPC envelope is :mod:`protocol.rpc` (served by :mod:`.rpc_server`); the KV
operations live in :mod:`.kv_service`. This module wires them together, runs
housekeeping and reports status.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from protocol.config import Config
from protocol.errors import ErrorCode, S3Error
from protocol.rpc import Op
from protocol.rpc_auth import storage_rpc_key
from protocol.wire import MAX_DESCRIPTOR_BYTES

from .data_endpoint import DataEndpoint
from .gc_schedule import GcSchedule
from .kv_service import KVService, PacerFactory, VerbsOpener
from .local_sessions import SessionEndpoint
from .metrics import StorageServerMetrics
from .rdma_objects import RdmaObjects
from .registrations import open_pyverbs
from .rpc_server import Reply, RpcCall, RpcServer
from .shm_handover import HandoverServer
from .store import ChunkSource, ObjectStore
from .upload_expiry import UploadSweep

if TYPE_CHECKING:
    from .cluster import ClusterNode

log = logging.getLogger("objectcache.storage_server")


class StorageServer:
    """``pacers`` build extra per-transfer pacers (the bandwidth pool is built in); tests inject gates here.
    ``open_verbs`` opens the pyverbs engine's device (tests without one inject a fake)."""

    def __init__(self, config: Config, store: ObjectStore, chunks: ChunkSource, pacers: Sequence[PacerFactory] = (),
                 open_verbs: VerbsOpener = open_pyverbs) -> None:
        self.config = config
        self.store = store
        self.chunks = chunks
        self.started = time.time()
        self.kv = KVService(config, chunks, pacers, open_verbs)
        self.metrics = StorageServerMetrics(self.kv)
        self._stop_metrics: Callable[[], None] | None = None
        max_body = max(MAX_DESCRIPTOR_BYTES, config.gateway.kv_max_put_bytes)
        self.data = DataEndpoint(config.storage_server, self.kv.get, MAX_DESCRIPTOR_BYTES, self._incarnation)
        self._data_server: asyncio.AbstractServer | None = None
        self.sessions = SessionEndpoint(config.storage_server, f"{config.rpc_socket}-session", self.kv.get, MAX_DESCRIPTOR_BYTES,
                                        self._incarnation)
        self.rpc = RpcServer({
            Op.PING: self._ping,
            Op.STATUS: self._status,
            Op.KV_GET: self.kv.get,
            Op.KV_PUT: self.kv.put,
            Op.KV_LOOKUP: self.kv.lookup,
            Op.KV_REGISTER: self.kv.registrations.register,
            Op.KV_UNREGISTER: self.kv.registrations.unregister,
            Op.KV_REGISTER_RDMA: self.kv.registrations.register_rdma,
            Op.KV_TICKET: self.data.ticket,
            Op.KV_SESSION: self.sessions.offer,
            Op.RDMA_GET_OBJECT: RdmaObjects(store, self.kv.regions).get_object,
        }, max_body=max_body)
        self.rpc_key = storage_rpc_key(config.storage_server.rpc_key, config.storage_server.rpc_key_file)
        self.handover = HandoverServer(self.kv.regions, self.kv.registrations.handover_socket)
        self._housekeeper: asyncio.Task | None = None
        self.gc = GcSchedule(busy=lambda: bool(self.kv.active))
        self.cluster = _cluster_node(config, chunks, self.data, self.kv)
        self.estimator = None
        if self.cluster is not None:
            from .cluster.estimator import Estimator

            self.estimator = Estimator(self.cluster, self.kv)
        self.rpc.handlers[Op.KV_ESTIMATE] = self.estimator.rpc if self.estimator is not None else _no_estimate

    async def start(self) -> asyncio.AbstractServer:
        self.gc.start()
        self._housekeeper = asyncio.ensure_future(self.housekeeping())
        await self.handover.start()
        await self.sessions.listen()
        m = self.config.metrics
        if m.storage_server_port:
            self._stop_metrics = self.metrics.listen(m.host, m.storage_server_port)
        self._data_server = await self.data.listen()
        if self.cluster is not None:
            await self.cluster.start()
        if self.estimator is not None:
            self.estimator.start()
        return await self.rpc.listen(str(self.config.rpc_socket), self.config.storage_server.tcp, self.rpc_key)

    async def housekeeping(self) -> None:
        """Free what nobody will release: files left by a crash (once), then periodically
        handles of deleted chunks and regions of vanished clients."""
        ss = self.config.storage_server
        try:
            orphans = await self.store.reclaim_orphans()
            if orphans:
                log.warning("housekeeping: removed %d unreferenced object files left by an earlier crash", orphans)
        except Exception:
            log.exception("housekeeping: reclaiming crash leftovers failed (will retry at the next start)")
        uploads = UploadSweep(self.store, ss.abort_incomplete_uploads_s, ss.housekeeping_s)
        while True:
            await asyncio.sleep(ss.housekeeping_s)
            try:
                await uploads.maybe_run()
                swept = await self.chunks.housekeeping()
                expired = self.kv.regions.expire(ss.region_idle_s)
                self.sessions.registry.expire()
                self.gc.housekeeping()
            except Exception:  # one bad round must not end housekeeping for the daemon's lifetime
                log.exception("housekeeping round failed")
                continue
            if any(swept.values()) or expired:
                log.info("housekeeping: %s, dropped %d idle regions", swept, expired)

    async def _incarnation(self, bucket: str) -> str:
        return await self.chunks.incarnation(bucket, self._ask_incarnation)

    async def _ask_incarnation(self, bucket: str) -> str:
        return (await self.store.get_bucket(bucket)).incarnation

    async def _ping(self, call: RpcCall) -> Reply:
        return {"pong": True}

    async def _status(self, call: RpcCall) -> Reply:
        """The operator's full view; with a ``tenant`` field (a tenant's kv-status), only that tenant's part."""
        tenant = call.request.fields.get("tenant")
        if tenant is not None:
            return self.kv.tenant_status(str(tenant))
        return {
            "uptime_s": time.time() - self.started,
            "data_dir": str(self.config.data_dir),
            "pid": os.getpid(),
            "open_fds": len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else -1,
            **self.kv.status(),
            "local_sessions": self.sessions.registry.status() | {"connections": self.sessions.connections, "kv_gets": self.sessions.kv_gets,
                                                                     "key_lists": self.sessions.key_lists.status()},
            **self.chunks.status(),
            **(self.cluster.status() if self.cluster is not None else {}),
            **({"oracle": self.estimator.status()} if self.estimator is not None else {}),
        }

    async def drain(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for the kv-gets in flight to end (call once the RPC socket no longer accepts),
        then stop the rest; how many were still running at the deadline."""
        if self._data_server is not None:
            self._data_server.close()  # no new direct kv-gets either
        self.sessions.close()  # nor local fast-path ones
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if self.kv.active:
            log.info("draining: %d transfer(s) in flight, up to %g s", len(self.kv.active), timeout_s)
        while self.kv.active and loop.time() < deadline:
            await asyncio.sleep(0.05)
        left = len(self.kv.active)
        if left:
            log.warning("drain timeout: stopping %d transfer(s) still running", left)
            await self.kv.stop_transfers()
        return left

    async def close(self) -> None:
        if self._housekeeper is not None:
            self._housekeeper.cancel()
        self.gc.stop()
        if self._stop_metrics is not None:
            self._stop_metrics()
        if self._data_server is not None:
            self._data_server.close()
        self.handover.close()
        self.sessions.close()
        if self.estimator is not None:
            self.estimator.close()
        if self.cluster is not None:
            await self.cluster.close()
        await self.kv.close()
        await self.chunks.close()
        await self.store.close()


def _cluster_node(config: Config, chunks: ChunkSource, data: DataEndpoint, kv: KVService) -> "ClusterNode | None":
    """The cluster membership of this node when ``cluster.node_id`` is set (the config refuses it without the s3 backend)."""
    if not config.cluster.enabled:
        return None
    from .cluster import ClusterNode
    from .store.s3.chunks import S3ChunkSource

    assert isinstance(chunks, S3ChunkSource)
    return ClusterNode(config, chunks, data, kv)


async def _no_estimate(call: RpcCall) -> Reply:
    raise S3Error(ErrorCode.NotImplemented, "kv-estimate is answered by cluster nodes (set cluster.node_id): this node has no cluster")
