"""This storage server as a member of a cluster: the peer listener, membership, and the peer path into its cache.

Built by the daemon when ``cluster.node_id`` is set (the s3 backend only: nodes share caches in
front of one upstream). It plugs into the chunk source as its second source, so the kv-get path
itself does not change: a pin asks the peers before the upstream.
"""

from __future__ import annotations

import asyncio
import logging

from protocol.cluster import NodeInfo
from protocol.config import Config

from ..data_endpoint import DataEndpoint
from ..kv_service import KVService
from ..store.s3.chunks import S3ChunkSource
from .direct_rdma import DirectRdma
from .fetcher import PeerFetcher
from .membership import Membership
from .peer_server import PeerServer

log = logging.getLogger("objectcache.cluster")


class ClusterNode:
    def __init__(self, config: Config, chunks: S3ChunkSource, data: DataEndpoint | None = None, kv: KVService | None = None) -> None:
        self.cfg = config.cluster
        self.chunks = chunks
        self.data = data
        self.kv = kv
        self.server = PeerServer(self.cfg, chunks, data, kv.registrations.nixl_engine if kv is not None else None)
        self.me: NodeInfo | None = None
        self.members: Membership | None = None
        self.fetcher: PeerFetcher | None = None
        self.direct: DirectRdma | None = None
        self._listener: asyncio.AbstractServer | None = None
        self._beats: asyncio.Task | None = None

    async def start(self) -> None:
        cfg = self.cfg
        self._listener = await self.server.listen(cfg.listen)
        address = cfg.advertise
        if not address:
            host = cfg.listen.rpartition(":")[0]
            address = f"{host}:{self._listener.sockets[0].getsockname()[1]}"
        self.me = NodeInfo(cfg.node_id, address, cfg.zone, cfg.rack, cfg.host)
        self.members = Membership(cfg, self.me, self.chunks.up)
        await self.members.start()
        self._beats = asyncio.ensure_future(self.members.run())
        self.fetcher = PeerFetcher(cfg, self.me, self.members, self.chunks)
        self.chunks.second = self.fetcher
        if self.data is not None:
            self.data.elsewhere = self.fetcher.direct_grant
        if self.kv is not None:
            self.direct = DirectRdma(cfg, self.me, self.members, self.chunks, self.fetcher)
            self.kv.delegate = self.direct
            self.kv.peer_pace = self.server.pace.take if self.cfg.serve_max_bytes_per_s > 0 else None
        log.info("cluster: node %s serving peers on %s", cfg.node_id, address)

    def status(self) -> dict[str, object]:
        return {"cluster": {
            "node": self.me.to_json() if self.me else None,
            "members": self.members.status() if self.members else [],
            "live_peers": [n.node_id for n in self.members.live()] if self.members else [],
            "served": self.server.status(),
            **(self.fetcher.status() if self.fetcher else {}),
            **(self.direct.status() if self.direct else {}),
        }}

    async def close(self) -> None:
        self.chunks.second = None
        if self.data is not None:
            self.data.elsewhere = None
        if self.kv is not None:
            self.kv.delegate = None
            self.kv.peer_pace = None
        if self._beats is not None:
            self._beats.cancel()
        if self._listener is not None:
            self._listener.close()
        if self.members is not None:
            await self.members.leave()
