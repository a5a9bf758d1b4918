"""Peer -> engine over ``rdma``: a kv-get delivered into the engine's registered memory by other nodes, in parts.

With ``cluster.direct_from_peers``, an rdma kv-get (a region registered through NIXL) whose chunks
this node lacks and a peer holds whole is written by that peer straight into the engine's memory
(``peer-write``, :mod:`protocol.cluster_write`): the chunks never enter this node's cache. With
``cluster.direct_split_peers`` = k, the payload is cut by chunk ranges into parts written by up
to k + 1 nodes at once (this node among them when it holds the prefix itself): two nodes'
links deliver one kv-get. Layer ℓ is reported to the engine (its LAYER frame, with the CRC32C
combined from every part's report) only once every part of it has landed, from whichever node.

Failover inside the stream: a part whose peer stops, breaks or stalls past ``peer_timeout_s`` is
fenced (:meth:`~.peer_client.PeerWrite.fence`: the peer stops at its next step and closes; a
dead peer's connection closes with it) and its remaining layers are written by this node, from
its cache or whatever path its chunk source takes (another peer, the upstream). The takeover
waits for the fence: until the peer closed, or ``fence_timeout_s`` when it does not answer (a
stalled process then finds the fence before its next step, see :class:`~.peer_server._EndWatch`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import replace

from protocol.checksums import crc32c_combine
from protocol.cluster import NodeInfo
from protocol.cluster_auth import PeerGrant, keys_digest
from protocol.cluster_write import RegionGrant, WritePart, agent_digest
from protocol.config import ClusterConfig
from protocol.wire import Descriptor, TransferStats, encode_descriptor

from ..store.chunk_source import PinFor
from ..store.s3.chunks import S3ChunkSource
from ..transports.base import Transport
from ..transports.nixl_engine import NixlLink
from ..transports.rdma import RdmaTransport
from .fetcher import PeerFetcher, split
from .membership import Membership
from .part_writer import write_part
from .peer_client import PeerCall, PeerFault, PeerWrite

log = logging.getLogger("objectcache.cluster")


class Delivery:
    """Which parts of which layers have landed, their CRCs, and the bytes per path."""

    def __init__(self, parts: list[WritePart], num_layers: int, s: int) -> None:
        self.parts, self.s = parts, s
        self.crcs: list[list[int | None]] = [[None] * len(parts) for _ in range(num_layers)]
        self.paths: dict[str, int] = {}
        self.failovers = 0
        self.changed = asyncio.Event()

    def landed(self, part: int, layer: int, crc: int, paths: dict[str, int]) -> None:
        self.crcs[layer][part] = crc
        for path, n in paths.items():
            self.paths[path] = self.paths.get(path, 0) + n
        self.changed.set()

    def complete(self, layer: int) -> bool:
        return all(c is not None for c in self.crcs[layer])

    def checksum(self, layer: int) -> int:
        """The layer's CRC32C from its parts' (in chunk order: the parts are consecutive chunk ranges)."""
        crc = 0
        for part, c in zip(self.parts, self.crcs[layer]):
            assert c is not None
            crc = crc32c_combine(crc, c, part.chunks * self.s)
        return crc


class DirectRdma:
    def __init__(self, cfg: ClusterConfig, me: NodeInfo, members: Membership, cache: S3ChunkSource, fetcher: PeerFetcher) -> None:
        self.cfg, self.me, self.members, self.cache, self.fetcher = cfg, me, members, cache, fetcher
        self.key = cfg.key.encode()
        self.delegated = 0
        self.failovers = 0

    async def delegate(self, tenant: str, bucket: str, request_id: str, d: Descriptor, transport: Transport,
                       accept: Callable[[], None]) -> TransferStats | None:
        """The kv-get written by peers (and this node) straight into the engine's memory, or None to serve it here."""
        if not self.cfg.direct_from_peers or not isinstance(transport, RdmaTransport):
            return None
        link = transport.link
        if not isinstance(link, NixlLink) or not link.metadata:
            return None  # the pyverbs engine's queue pairs are this node's own
        keys, n = d.chunk_keys, len(d.chunk_keys)
        bucket_id = await self.cache.store.bucket_id(bucket)
        local = next((i for i, k in enumerate(keys) if self.cache.cached_size(bucket_id, k)[1] is None), n)
        split_peers = self.cfg.direct_split_peers
        peers = self.members.live()
        if not peers or (local == n and split_peers == 0):
            return None
        grant = PeerGrant(tenant, bucket, bucket_id, keys_digest(keys), n, request_id, self.me.node_id,
                          time.time() + self.cfg.grant_ttl_s, secrets.token_hex(8))
        call = PeerCall(bucket, bucket_id, keys, grant.sign(self.key))
        answers = (await self.fetcher._ask(peers, call)).values()  # peers holding the whole prefix write, nearest first
        holders = [p for p, warm in sorted(answers, key=lambda a: (self.me.distance(a[0]), a[0].node_id)) if warm == n]
        writers: list[NodeInfo | None] = [None, *holders[:split_peers]] if local == n else [*holders[:1 + split_peers]]
        if not holders or len(writers) > n:
            return None
        region = RegionGrant(tenant, request_id, grant.nonce, agent_digest(link.metadata), link.addr, link.size, link.device,
                             time.time() + self.cfg.grant_ttl_s).sign(self.key)
        parts = [WritePart(lo, hi, 0, d.num_layers) for lo, hi in split(0, n, len(writers))]
        accept()
        self.delegated += 1
        return await self._deliver(d, transport, link, parts, writers, call, region, PinFor(tenant, request_id, d.chunk_object_bytes), bucket)

    async def _deliver(self, d: Descriptor, transport: Transport, link: NixlLink, parts: list[WritePart],
                       writers: list[NodeInfo | None], call: PeerCall, region: str, pin_for: PinFor, bucket: str) -> TransferStats:
        started = time.perf_counter()
        s, n = d.per_layer_chunk_bytes, len(d.chunk_keys)
        got = Delivery(parts, d.num_layers, s)
        descriptor = encode_descriptor(d)

        async def mine(i: int, part: WritePart) -> None:
            """A part (or a failed part's rest) from this node: its cache, or whatever path its chunk source takes."""
            pinned = await self.cache.pin(bucket, d.chunk_keys[part.chunk_lo:part.chunk_hi], pin_for)
            try:
                per_layer = {p: b // d.num_layers for p, b in (pinned.paths or {"local": sum(pinned.sizes)}).items()}

                async def landed(layer: int, crc: int) -> None:
                    got.landed(i, layer, crc, per_layer)

                await write_part(link, pinned, 0, part, d.target.offset, s, n, landed)
            finally:
                pinned.release()

        async def theirs(i: int, part: WritePart, peer: NodeInfo) -> None:
            layer = part.layer_lo
            stream: PeerWrite | None = None
            try:
                stream = await self.fetcher.client.write(peer, call, part, descriptor, link.metadata, region)
                while layer < part.layer_hi:
                    at, crc = await stream.next_layer()
                    if at != layer:
                        raise PeerFault(f"{peer.node_id} reported layer {at} where {layer} was due")
                    got.landed(i, layer, crc, {f"peer:{peer.node_id}": part.chunks * s})
                    layer += 1
                stream.writer.close()
                return
            except PeerFault as e:
                fenced = await stream.fence(self.cfg.fence_timeout_s) if stream is not None else True
                log.warning("cluster: %s (request %s); layers %d.. of its part come through this node%s", e, pin_for.request_id,
                            layer, "" if fenced else f" (no answer to the fence within {self.cfg.fence_timeout_s:g} s)")
            except BaseException:
                if stream is not None:
                    stream.writer.close()  # the peer finds the end of stream before its next step
                raise
            got.failovers += 1
            self.failovers += 1
            await mine(i, replace(part, layer_lo=layer))

        tasks = [asyncio.ensure_future(mine(i, p) if w is None else theirs(i, p, w)) for i, (p, w) in enumerate(zip(parts, writers))]
        for t in tasks:
            t.add_done_callback(lambda _: got.changed.set())
        first_layer_s = 0.0
        try:
            for layer in range(d.num_layers):
                while True:
                    got.changed.clear()
                    if got.complete(layer):
                        break
                    for t in tasks:
                        if t.done() and not t.cancelled() and t.exception() is not None:
                            raise t.exception()  # type: ignore[misc]
                    await got.changed.wait()
                await transport.layer_ready(layer, got.checksum(layer))
                if layer == 0:
                    first_layer_s = time.perf_counter() - started
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        total = time.perf_counter() - started
        return TransferStats(mode="layerwise", payload_bytes=d.payload_bytes, delivery_s=total, total_s=total,
                             first_layer_s=first_layer_s, paths=dict(got.paths), failovers=got.failovers)

    def status(self) -> dict[str, object]:
        return {"direct_rdma": self.delegated, "direct_rdma_failovers": self.failovers}
