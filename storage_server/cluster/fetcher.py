"""The second load path into this node's cache: chunks a kv-get misses, fetched from peers' caches.

For one pin: sign a grant for the missing keys (the kv-get's tenant, bucket incarnation and exact key
list), ask every live peer at once how many leading missing chunks it holds warm (answers after
``lookup_timeout_s`` are not waited for), rank them (:func:`.paths.rank_peers`) and stream from the
best, its range split over up to ``fetch_concurrency`` streams. Each chunk is checked (index, size,
CRC32C), written through the cache exactly like an upstream fetch and pinned. A stream that breaks,
stalls or sends a bad chunk is a failover: the next ranked peer takes the chunks still missing, and
whatever no peer brought comes from the upstream (:class:`~storage_server.store.s3.chunks.S3ChunkSource`);
with ``cluster.cold_split_peers`` set, that cold rest is split: this node's share from the upstream
and the nearest peers' shares through their own upstream links and caches (``fill``), at once.
A stale answer costs a short stream and an upstream fetch, never wrong bytes.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from protocol.cluster import NodeInfo, PeerFetchRange
from protocol.cluster_auth import PeerGrant
from protocol.config import ClusterConfig
from protocol.errors import S3Error
from protocol.wire import decode_descriptor

from ..store.chunk_source import PinFor
from ..store.s3.chunks import Filled, S3ChunkSource
from .membership import Membership
from .paths import Candidate, cold_helpers, direct_peer, rank_peers, shares
from .peer_client import PeerCall, PeerClient, PeerFault

log = logging.getLogger("objectcache.cluster")


@dataclass
class PeerTally:
    """What this node fetched from each peer (status and metrics)."""

    bytes: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # summed over concurrent streams
    wall_s: dict[str, float] = field(default_factory=dict)  # while at least one stream from the peer ran: its achieved rate's time
    inflight: dict[str, int] = field(default_factory=dict)  # bytes asked of the peer and not yet landed (the oracle's queued bytes)
    failovers: int = 0
    lookups: int = 0
    direct: int = 0  # kv-gets handed to a peer's data endpoint


def split(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` as up to ``parts`` contiguous ranges of near-equal length."""
    n = hi - lo
    parts = max(1, min(parts, n))
    cuts = [lo + n * i // parts for i in range(parts + 1)]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


class PeerFetcher:
    def __init__(self, cfg: ClusterConfig, me: NodeInfo, members: Membership, cache: S3ChunkSource) -> None:
        self.cfg, self.me, self.members, self.cache = cfg, me, members, cache
        self.key = cfg.key.encode()
        self.client = PeerClient(me.node_id, self.key, cfg.peer_timeout_s)
        self.tally = PeerTally()

    async def _ask(self, peers: list[NodeInfo], call: PeerCall) -> list[Candidate]:
        tasks = {asyncio.ensure_future(self.client.lookup(p, call)): p for p in peers}
        done, pending = await asyncio.wait(tasks, timeout=self.cfg.lookup_timeout_s)
        for t in pending:
            t.cancel()
        out = []
        for t in done:
            if t.exception() is None:
                out.append(Candidate(tasks[t], t.result().warm))
            else:
                log.info("cluster lookup: %s", t.exception())
        return out

    async def warm_on_peers(self, tenant: str, bucket: str, bucket_id: str, keys: list[str], request_id: str) -> dict[str, int]:
        """How many leading ``keys`` each live peer holds warm (the tenant's bucket incarnation only, under a grant
        for exactly these keys), from one batched lookup bounded by ``lookup_timeout_s``; silent peers are left out."""
        peers = self.members.live()
        if not peers:
            return {}
        grant = PeerGrant.issue(self.key, tenant=tenant, bucket=bucket, bucket_id=bucket_id, keys=keys,
                                request_id=request_id, issuer=self.me.node_id, ttl_s=self.cfg.grant_ttl_s)
        return {c.peer.node_id: c.warm for c in await self._ask(peers, PeerCall(bucket, bucket_id, keys, grant))}

    async def fill(self, bucket: str, bucket_id: str, wanted: list[tuple[str, str]], pin_for: PinFor,
                   cache: S3ChunkSource, filled: Filled) -> None:
        peers = self.members.live()
        if not peers or not wanted:
            return
        keys = [k for k, _ in wanted]
        grant = PeerGrant.issue(self.key, tenant=pin_for.tenant, bucket=bucket, bucket_id=bucket_id, keys=keys,
                                request_id=pin_for.request_id, issuer=self.me.node_id, ttl_s=self.cfg.grant_ttl_s)
        call = PeerCall(bucket, bucket_id, keys, grant)
        self.tally.lookups += 1
        answers = await self._ask(peers, call)
        ranked = rank_peers(self.me, answers)
        have = [False] * len(wanted)
        failed: set[str] = set()
        for cand in ranked:
            todo = [i for i in range(cand.warm) if not have[i]]
            if todo and not await self._runs_from(cand.peer, call, todo, wanted, have, pin_for, cache, filled, fill=False):
                failed.add(cand.peer.node_id)
        rest = [i for i in range(len(wanted)) if not have[i]]
        answered = [a.peer for a in answers]  # a peer that did not answer the lookup in time is not given a share either
        helpers = cold_helpers(self.me, answered, self.cfg.cold_split_peers, failed) if rest else []
        if helpers:
            own, *theirs = shares(rest, len(helpers) + 1)
            await asyncio.gather(self._own_share(bucket, own, wanted, have, cache, filled, pin_for.tenant),
                                 *(self._runs_from(p, call, share, wanted, have, pin_for, cache, filled, fill=True)
                                   for p, share in zip(helpers, theirs) if share))

    async def _runs_from(self, peer: NodeInfo, call: PeerCall, todo: list[int], wanted: list[tuple[str, str]], have: list[bool],
                         pin_for: PinFor, cache: S3ChunkSource, filled: Filled, fill: bool) -> bool:
        """``todo`` (indices into ``wanted``) from ``peer`` over up to ``fetch_concurrency`` streams; False (a failover) if any broke."""
        runs = _runs(todo)
        ranges = [r for lo, hi in runs for r in split(lo, hi, max(1, self.cfg.fetch_concurrency // len(runs)))]
        t = self.tally
        started = asyncio.get_running_loop().time()
        try:
            results = await asyncio.gather(*(self._stream(peer, call, lo, hi, wanted, have, pin_for, cache, filled, fill) for lo, hi in ranges))
        finally:
            t.wall_s[peer.node_id] = t.wall_s.get(peer.node_id, 0.0) + asyncio.get_running_loop().time() - started
        if all(results):
            return True
        filled.failovers += 1
        self.tally.failovers += 1
        return False

    async def _own_share(self, bucket: str, own: list[int], wanted: list[tuple[str, str]], have: list[bool], cache: S3ChunkSource,
                         filled: Filled, tenant: str) -> None:
        """This node's share of a split cold miss, from the upstream as its own misses come (beside the peers' shares).
        A chunk that fails here is left to the kv-get's own upstream path, which names the error."""
        gate = asyncio.Semaphore(cache.concurrency)

        async def one(i: int) -> None:
            key, cid = wanted[i]
            async with gate:
                try:
                    fetched = await cache.fetch_upstream_pinned(bucket, key, cid, tenant)
                except S3Error:
                    return
            have[i] = True
            filled.pinned.append(cid)
            if fetched:
                filled.paths["upstream"] = filled.paths.get("upstream", 0) + (cache.files.size(cid) or 0)

        await asyncio.gather(*(one(i) for i in own))

    async def _stream(self, peer: NodeInfo, call: PeerCall, lo: int, hi: int, wanted: list[tuple[str, str]], have: list[bool],
                      pin_for: PinFor, cache: S3ChunkSource, filled: Filled, fill: bool = False) -> bool:
        """Chunks ``[lo, hi)`` from ``peer`` into the cache; False when the stream failed before delivering them all."""
        path = f"peer:{peer.node_id}"
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def land(index: int, data: bytes, version: str) -> None:
            cid = wanted[index][1]
            if have[index] or not cache.claim(cid):  # another request is fetching it (or it arrived meanwhile)
                return
            try:
                if await cache.store_fetched(cid, data, version, pin_for.tenant):
                    have[index] = True
                    filled.pinned.append(cid)
                    filled.paths[path] = filled.paths.get(path, 0) + len(data)
                    self.tally.bytes[peer.node_id] = self.tally.bytes.get(peer.node_id, 0) + len(data)
            finally:
                cache.release(cid)

        t = self.tally  # the oracle's queued bytes: what this stream has yet to land
        asked = (hi - lo) * pin_for.chunk_bytes
        t.inflight[peer.node_id] = t.inflight.get(peer.node_id, 0) + asked
        landed = 0

        async def counted(index: int, data: bytes, *more: str) -> None:
            nonlocal landed
            landed += len(data)
            t.inflight[peer.node_id] -= len(data)
            await land(index, data, *more)

        try:
            got = await self.client.fetch(peer, call, PeerFetchRange(lo, hi - lo, fill), pin_for.chunk_bytes, counted)
            ok = got == hi - lo
        except PeerFault as e:
            log.warning("cluster: %s (request %s); the remaining chunks take another path", e, pin_for.request_id)
            ok = False
        finally:
            t.inflight[peer.node_id] -= asked - landed
        self.tally.seconds[peer.node_id] = self.tally.seconds.get(peer.node_id, 0.0) + loop.time() - started
        return ok

    async def direct_grant(self, tenant: str, bucket: str, request_id: str, descriptor: bytes) -> dict | None:
        """Peer -> engine: when this node lacks chunks of an http kv-get that one peer holds whole, a ticket for that peer's
        data endpoint (the client streams from it directly); None to serve here (any failure also means: serve here)."""
        if not self.cfg.direct_from_peers:
            return None
        keys = decode_descriptor(descriptor).chunk_keys
        peers = self.members.live()
        bucket_id = await self.cache.store.bucket_id(bucket)
        if not peers or all(self.cache.cached_size(bucket_id, k)[1] is not None for k in keys):
            return None
        grant = PeerGrant.issue(self.key, tenant=tenant, bucket=bucket, bucket_id=bucket_id, keys=keys, request_id=request_id,
                                issuer=self.me.node_id, ttl_s=self.cfg.grant_ttl_s)
        call = PeerCall(bucket, bucket_id, keys, grant)
        peer = direct_peer(self.me, await self._ask(peers, call), len(keys))
        if peer is None:
            return None
        try:
            ticket = await self.client.ticket(peer, call, descriptor)
        except PeerFault as e:
            log.info("cluster: no direct path (%s); serving request %s here", e, request_id)
            return None
        self.tally.direct += 1
        return ticket.to_json()

    def status(self) -> dict[str, object]:
        t = self.tally
        rates = {p: round(b / t.seconds[p]) for p, b in t.bytes.items() if t.seconds.get(p)}
        return {"fetched_bytes": dict(t.bytes), "fetch_bytes_per_s": rates, "failovers": t.failovers, "lookups": t.lookups,
                "direct_grants": t.direct}


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    """Sorted indices as maximal ``[lo, hi)`` runs."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs
