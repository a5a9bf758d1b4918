"""The second load path into this node's cache: chunks a kv-get misses, fetched from peers' caches.

For one pin: sign a grant for the missing keys (the kv-get's tenant, bucket incarnation and exact key
list), ask every live peer at once how many leading missing chunks it holds warm (answers after
``lookup_timeout_s`` are not waited for), then let the cluster's path scheduler decide:
:func:`scheduler.paths.choose_path` over the oracle's view of this node's links
(:func:`.oracle_view.build_view`: the peers' caches, the upstream through this node and, with
``cluster.cold_split_peers`` = k, through up to k answering peers' links and caches) picks the path or
split that minimises the kv-get's predicted TTFT, and :func:`.paths.actions` turns its segments into
streams, all at once: a peer's range split over up to ``fetch_concurrency`` streams, a helper's
share fetched upstream by it (``fill``), this node's share by its own GETs. Each chunk is checked
(index, size, CRC32C), written through the cache exactly like an upstream fetch and pinned. A
stream that breaks, stalls or sends a bad chunk is a failover: its peer is gone for this kv-get and
the scheduler is asked again for the chunks still missing; whatever no peer brought comes from the
upstream (:class:`~storage_server.store.s3.chunks.S3ChunkSource`). A stale answer costs a short
stream and an upstream fetch, never wrong bytes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace

from protocol.cluster import NodeInfo, PeerFetchRange
from protocol.cluster_auth import PeerGrant
from protocol.config import ClusterConfig
from protocol.errors import S3Error
from protocol.wire import decode_descriptor
from scheduler.paths import NoPath, OracleView, PathChoice, PathRequest, choose_path, peer_first, with_choice

from ..store.chunk_source import PinFor
from ..store.s3.chunks import Filled, S3ChunkSource
from .membership import Membership
from .oracle_view import NodeLoad, TierMap, build_view
from .paths import Action, Move, actions, runs
from .peer_client import PeerCall, PeerClient, PeerFault
from .peer_server import FILL_BATCH

LAND_BATCH = 4  # chunks of one peer stream written into the cache in one trip to a worker thread
LAND_WINDOW = 2  # such batches of one stream being written at once

log = logging.getLogger("objectcache.cluster")


@dataclass
class PeerTally:
    """What this node fetched from each peer (status and metrics)."""

    bytes: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # summed over concurrent streams
    flow_bytes: dict[str, int] = field(default_factory=dict)  # bytes landed after each fetch's first chunk ...
    flow_s: dict[str, float] = field(default_factory=dict)  # ... over the time from that first chunk to the last: the link's rate
    inflight: dict[str, int] = field(default_factory=dict)  # bytes asked of the peer and not yet landed (the oracle's queued bytes)
    failovers: int = 0
    lookups: int = 0
    direct: int = 0  # kv-gets handed to a peer's data endpoint
    resumed: int = 0  # http kv-gets asked again from a layer on, after a peer's direct stream of them broke or stalled
    choices: int = 0  # path choices made (one per missing run per round)


@dataclass
class Flow:
    """When one fetch from a peer landed its first and last chunk (its rate leaves out the set-up before the first)."""

    first_at: float = -1.0
    last_at: float = -1.0
    first_bytes: int = 0
    bytes: int = 0

    def landed(self, now: float, nbytes: int) -> None:
        if self.first_at < 0:
            self.first_at, self.first_bytes = now, nbytes
        self.last_at = now
        self.bytes += nbytes


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
        self.tiers = TierMap.from_config(cfg, cache.concurrency)
        self.load: Callable[[], NodeLoad] = NodeLoad  # the node's live link picture (the estimator's, once it runs)
        self.taken: dict[str, list[tuple[str, int]]] = {}  # request id -> (source, chunks) fetched: the oracle's record

    async def _ask(self, peers: list[NodeInfo], call: PeerCall) -> dict[str, tuple[NodeInfo, int]]:
        """Each answering peer and how many leading keys of ``call`` it holds warm."""
        tasks = {asyncio.ensure_future(self.client.lookup(p, call)): p for p in peers}
        done, pending = await asyncio.wait(tasks, timeout=self.cfg.lookup_timeout_s)
        for t in pending:
            t.cancel()
        out = {}
        for t in done:
            if t.exception() is None:
                out[tasks[t].node_id] = (tasks[t], t.result().warm)
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
        return {node: warm for node, (_, warm) in (await self._ask(peers, PeerCall(bucket, bucket_id, keys, grant))).items()}

    @property
    def max_segments(self) -> int:
        """A peer's front, this node's upstream share and up to ``cold_split_peers`` helpers' shares."""
        return 2 + self.cfg.cold_split_peers

    def view(self, warm: dict[str, int], num_chunks: int, chunk_bytes: float, gone: Collection[str] = (), direct: bool = False,
             revalidate_s: float = 0.0) -> OracleView:
        """The oracle's view of this node's paths for ``num_chunks`` chunks (``warm``: leading chunks held per node;
        ``revalidate_s``: a pin yet to come checks its stale cached chunks first)."""
        nodes = {n.node_id: n for n in [self.me, *self.members.live()]}
        helpers = [p for p in warm if p != self.me.node_id] if self.cfg.cold_split_peers > 0 else []
        return build_view(self.me, nodes, warm, num_chunks, self.tiers, self.load(), self.cfg.estimate_stale_after_s,
                          chunk_bytes=chunk_bytes, helpers=helpers, direct=direct, gone=gone, relay_batch_chunks=FILL_BATCH,
                          revalidate_s=revalidate_s)

    def choose(self, request: PathRequest, view: OracleView) -> PathChoice:
        """``cluster.path_choice``: the path scheduler, or the fixed peer-first rule it is compared with."""
        if self.cfg.path_choice == "peer-first":
            return peer_first(request, view)
        return choose_path(request, view, max_segments=self.max_segments)

    def plan(self, todo: list[tuple[int, int]], warm: dict[str, int], num_chunks: int, pin_for: PinFor,
             gone: Collection[str]) -> list[Action]:
        """The scheduler's choice for each missing run ``[lo, hi)``, each seeing the flows of those placed before it."""
        view = self.view(warm, num_chunks, float(pin_for.chunk_bytes), gone)
        out: list[Action] = []
        for lo, hi in todo:
            try:
                choice = self.choose(PathRequest(hi, float(pin_for.chunk_bytes), pin_for.num_layers, first_chunk=lo), view)
            except NoPath:  # nobody left but this node's own upstream path, which the pin takes anyway
                continue
            self.tally.choices += 1
            view = with_choice(view, choice)
            out += actions(choice, self.me.node_id)
        return out

    async def fill(self, bucket: str, bucket_id: str, wanted: list[tuple[str, str]], pin_for: PinFor,
                   cache: S3ChunkSource, filled: Filled) -> None:
        peers = self.members.live()
        if not peers or not wanted or self.cfg.path_choice == "upstream":
            return
        keys = [k for k, _ in wanted]
        grant = PeerGrant.issue(self.key, tenant=pin_for.tenant, bucket=bucket, bucket_id=bucket_id, keys=keys,
                                request_id=pin_for.request_id, issuer=self.me.node_id, ttl_s=self.cfg.grant_ttl_s)
        call = PeerCall(bucket, bucket_id, keys, grant)
        self.tally.lookups += 1
        answers = await self._ask(peers, call)
        warm = {node: w for node, (_, w) in answers.items()}
        have = [False] * len(wanted)
        gone: set[str] = set()
        for _ in range(len(answers) + 1):  # each round either finishes or loses a peer
            todo = runs([i for i, h in enumerate(have) if not h])
            moves = self.plan(todo, warm, len(wanted), pin_for, gone) if todo else []
            if all(a.move is Move.OWN for a in moves):
                self._record(pin_for.request_id, moves, [True] * len(moves))
                return  # this node's upstream GETs alone: the pin's own path takes what is missing
            results = await asyncio.gather(*(self._act(a, answers, call, bucket, wanted, have, pin_for, cache, filled) for a in moves))
            self._record(pin_for.request_id, moves, results)
            failed = {a.node for a, ok in zip(moves, results) if not ok}
            if not failed:
                return
            gone |= failed

    def _record(self, request_id: str, moves: list[Action], ok: list[bool]) -> None:
        """The shares a kv-get's pin fetched, for the oracle to predict what it did (the newest 256 kv-gets kept)."""
        if not request_id:
            return
        names = {Move.PEER: "peer:{}", Move.FILL: "upstream@{}", Move.OWN: "upstream@{}"}
        self.taken.setdefault(request_id, []).extend((names[a.move].format(a.node), a.hi - a.lo) for a, good in zip(moves, ok)
                                                      if good and a.move in names)
        while len(self.taken) > 256:
            self.taken.pop(next(iter(self.taken)))

    async def _act(self, a: Action, answers: dict[str, tuple[NodeInfo, int]], call: PeerCall, bucket: str, wanted: list[tuple[str, str]],
                   have: list[bool], pin_for: PinFor, cache: S3ChunkSource, filled: Filled) -> bool:
        todo = [i for i in range(a.lo, a.hi) if not have[i]]
        if a.move is Move.OWN:
            await self._own_share(bucket, todo, wanted, have, cache, filled, pin_for.tenant)
            return True
        if a.move is Move.DIRECT:
            raise ValueError("a direct path is answered with a ticket, never inside a pin")
        return await self._runs_from(answers[a.node][0], call, todo, wanted, have, pin_for, cache, filled, fill=a.move is Move.FILL)

    async def _runs_from(self, peer: NodeInfo, call: PeerCall, todo: list[int], wanted: list[tuple[str, str]], have: list[bool],
                         pin_for: PinFor, cache: S3ChunkSource, filled: Filled, fill: bool) -> bool:
        """``todo`` (indices into ``wanted``) from ``peer`` over up to ``fetch_concurrency`` streams; False (a failover) if any broke."""
        if not todo:
            return True
        spans = runs(todo)
        ranges = [r for lo, hi in spans for r in split(lo, hi, max(1, self.cfg.fetch_concurrency // len(spans)))]
        flow = Flow()
        results = await asyncio.gather(*(self._stream(peer, call, lo, hi, wanted, have, pin_for, cache, filled, fill, flow) for lo, hi in ranges))
        if not fill and flow.last_at > flow.first_at >= 0:  # a fill's pace is the helper's upstream GETs, not the link
            t, p = self.tally, peer.node_id
            t.flow_bytes[p] = t.flow_bytes.get(p, 0) + flow.bytes - flow.first_bytes
            t.flow_s[p] = t.flow_s.get(p, 0.0) + flow.last_at - flow.first_at
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
                filled.brought.append(cid)
                filled.paths["upstream"] = filled.paths.get("upstream", 0) + (cache.files.size(cid) or 0)

        await asyncio.gather(*(one(i) for i in own))

    async def _stream(self, peer: NodeInfo, call: PeerCall, lo: int, hi: int, wanted: list[tuple[str, str]], have: list[bool],
                      pin_for: PinFor, cache: S3ChunkSource, filled: Filled, fill: bool = False, flow: Flow | None = None) -> bool:
        """Chunks ``[lo, hi)`` from ``peer`` into the cache; False when the stream failed before delivering them all."""
        path = f"peer:{peer.node_id}"
        started = time.perf_counter()  # loop.time() is uvloop's per-iteration clock (1 ms steps): a fast stream's
        # chunks would all land "at once" and its rate would never be sampled

        async def land(batch: list[tuple[int, bytes, str]]) -> None:
            mine = [(i, data, version) for i, data, version in batch
                    if not have[i] and cache.claim(wanted[i][1])]  # else another request is fetching it (or it arrived meanwhile)
            try:
                stored = await cache.store_fetched_many([(wanted[i][1], data, version) for i, data, version in mine], pin_for.tenant)
                for (i, data, _), ok in zip(mine, stored):
                    if ok:
                        have[i] = True
                        filled.pinned.append(wanted[i][1])
                        filled.brought.append(wanted[i][1])
                        filled.paths[path] = filled.paths.get(path, 0) + len(data)
                        self.tally.bytes[peer.node_id] = self.tally.bytes.get(peer.node_id, 0) + len(data)
            finally:
                for i, _, _ in mine:
                    cache.release(wanted[i][1])

        t = self.tally  # the oracle's queued bytes: what this stream has yet to land
        asked = (hi - lo) * pin_for.chunk_bytes
        t.inflight[peer.node_id] = t.inflight.get(peer.node_id, 0) + asked
        landed = 0

        # Chunks are written into the cache LAND_BATCH at a time while the next ones arrive (up to LAND_WINDOW
        # batches at once): a write awaited before the next read left the stream idle for a thread hop per chunk.
        writing: list[asyncio.Future] = []  # every batch's landing, its outcome read once the stream is over
        batch: list[tuple[int, bytes, str]] = []

        async def flush() -> None:
            writing.append(asyncio.ensure_future(land(batch.copy())))
            batch.clear()
            while len(busy := [w for w in writing if not w.done()]) >= LAND_WINDOW:
                await asyncio.wait(busy, return_when=asyncio.FIRST_COMPLETED)

        arrivals = filled.arrivals

        def destination(index: int, size: int) -> memoryview | None:
            """A raw chunk not had yet is received into its row of the kv-get's arrivals (cut-through, no cache file)."""
            return None if arrivals is None or have[index] else arrivals.row(filled.rows[index], size)

        async def counted(index: int, data: bytes | bytearray | memoryview, version: str = "") -> None:
            nonlocal landed
            landed += len(data)
            t.inflight[peer.node_id] -= len(data)
            if flow is not None:
                flow.landed(time.perf_counter(), len(data))
            if arrivals is not None and arrivals.holds(filled.rows[index], data):
                if not have[index]:
                    have[index] = True
                    arrivals.landed[filled.rows[index]] = version
                    if cache.claim(wanted[index][1]):  # the cache gets it after the kv-get (else: cached, or another's)
                        filled.claimed.append(wanted[index][1])
                    filled.paths[path] = filled.paths.get(path, 0) + len(data)
                    self.tally.bytes[peer.node_id] = self.tally.bytes.get(peer.node_id, 0) + len(data)
                return
            batch.append((index, bytes(data), version))
            if len(batch) >= LAND_BATCH:
                await flush()

        try:
            got = await self.client.fetch(peer, call, PeerFetchRange(lo, hi - lo, fill), pin_for.chunk_bytes, counted, destination)
            ok = got == hi - lo
        except PeerFault as e:
            log.warning("cluster: %s (request %s); the remaining chunks take another path", e, pin_for.request_id)
            ok = False
        finally:
            if batch:  # what arrived before the stream ended (or broke) lands too
                writing.append(asyncio.ensure_future(land(batch.copy())))
                batch.clear()
            wrote = await asyncio.gather(*writing, return_exceptions=True)  # none left running once the stream is over
            t.inflight[peer.node_id] -= asked - landed
        for err in wrote:
            if isinstance(err, OSError):  # a write into this node's cache failed: those chunks take another path
                log.warning("cluster: writing %s's chunks failed (%s, request %s); they take another path", peer.node_id, err, pin_for.request_id)
                ok = False
            elif isinstance(err, BaseException):
                raise err
        self.tally.seconds[peer.node_id] = self.tally.seconds.get(peer.node_id, 0.0) + time.perf_counter() - started
        return ok

    async def direct_grant(self, tenant: str, bucket: str, request_id: str, descriptor: bytes) -> dict | None:
        """Peer -> engine: when the path scheduler picks a peer streaming this http kv-get straight to the engine
        (``direct:<W>``, offered for peers holding it whole), a ticket for that peer's data endpoint (the client streams
        from it directly); None to serve here (any failure also means: serve here)."""
        d = decode_descriptor(descriptor)
        if d.first_layer:
            self.tally.resumed += 1  # a peer's stream of it broke: the client asks again for the layers it lacks
        if not self.cfg.direct_from_peers or self.cfg.path_choice == "upstream":
            return None
        keys = d.chunk_keys
        peers = self.members.live()
        bucket_id = await self.cache.store.bucket_id(bucket)
        local = next((i for i, k in enumerate(keys) if self.cache.cached_size(bucket_id, k)[1] is None), len(keys))
        if not peers or local == len(keys):
            return None
        grant = PeerGrant.issue(self.key, tenant=tenant, bucket=bucket, bucket_id=bucket_id, keys=keys, request_id=request_id,
                                issuer=self.me.node_id, ttl_s=self.cfg.grant_ttl_s)
        call = PeerCall(bucket, bucket_id, keys, grant)
        answers = await self._ask(peers, call)
        warm = {self.me.node_id: local, **{node: w for node, (_, w) in answers.items()}}
        view = self.view(warm, len(keys), float(d.chunk_object_bytes), direct=True)
        try:
            moves = actions(self.choose(PathRequest(len(keys), float(d.chunk_object_bytes), d.num_layers), view), self.me.node_id)
        except NoPath:
            return None
        self.tally.choices += 1
        if not (len(moves) == 1 and moves[0].move is Move.DIRECT):
            return None
        try:
            ticket = await self.client.ticket(answers[moves[0].node][0], call, descriptor)
        except PeerFault as e:
            log.info("cluster: no direct path (%s); serving request %s here", e, request_id)
            return None
        self.tally.direct += 1
        # The client resumes through this node should the peer's stream break or stall past peer_timeout_s.
        return replace(ticket, peer=moves[0].node, stall_s=self.cfg.peer_timeout_s).to_json()

    def status(self) -> dict[str, object]:
        t = self.tally
        rates = {p: round(b / t.seconds[p]) for p, b in t.bytes.items() if t.seconds.get(p)}
        return {"fetched_bytes": dict(t.bytes), "fetch_bytes_per_s": rates, "failovers": t.failovers, "lookups": t.lookups,
                "direct_grants": t.direct, "direct_resumed": t.resumed, "path_choices": t.choices}

