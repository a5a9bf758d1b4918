"""The delivery-time oracle as a service on a cluster node: ``kv-estimate``, and each kv-get's own prediction.

``kv-estimate`` (:mod:`protocol.estimate`): for the asking tenant's bucket, the leading chunks warm in
this node's cache (under the bucket's incarnation) and on each live peer (one batched ``peer-lookup``
under a grant for that tenant and exactly these keys, bounded by ``cluster.lookup_timeout_s``), then
per candidate host the path :func:`scheduler.paths.choose_path` picks over the view
:func:`.oracle_view.build_view` draws, as a :class:`~protocol.estimate.CandidateEstimate`. A tenant
learns only about its own prefixes: another bucket's chunks have other cache ids and peers answer
under the grant's incarnation only.

Every ``estimate_refresh_s`` the measured rates are folded into their EWMAs: each peer's streams into
this node (bytes after each fetch's first chunk over the time from that chunk to its last: the set-up is the learnt fixed cost, not bandwidth) and this node's kv-gets to its engines
(payload over transfer time). What the links do not explain is learnt as a fixed cost per kind of source
from each kv-get's first-layer residual. Each kv-get's prediction (:meth:`forecast`) is the same model
evaluated, with the link picture taken when the kv-get arrived, on the paths its chunks took; the
metrics compare it with what was measured.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from protocol.cluster import NodeInfo
from protocol.errors import ErrorCode, S3Error
from protocol.estimate import EstimateReply, EstimateRequest
from protocol.wire import Descriptor, TransferStats
from scheduler.estimate import candidate_estimate
from scheduler.oracle import LineFit
from scheduler.paths import PathRequest, choose_path, fetch_phase, predict

from ..kv_service import Forecast, KVService, TransferInfo
from ..rpc_server import Reply, RpcCall
from ..store.s3.buckets import check_key
from .node import ClusterNode
from .oracle_view import (
    UPSTREAM_REQUESTS,
    FixedCosts,
    NodeLoad,
    Telemetry,
    TierMap,
    build_view,
    engine_link,
    fixed_cost,
    helper_prior,
    host_of,
    line_upstream_s,
    peer_link,
    taken_plan,
)
from .peer_server import FILL_BATCH

log = logging.getLogger("objectcache.cluster")


class Estimator:
    def __init__(self, node: ClusterNode, kv: KVService) -> None:
        self.node, self.kv, self.cfg = node, kv, node.cfg
        self.tiers = TierMap.from_config(node.cfg, node.chunks.concurrency)
        self.telemetry = Telemetry(node.cfg.rate_ewma_alpha)
        self.refreshed_at = time.monotonic()
        self.delivered = [0.0, 0.0]  # bytes and transfer seconds of this node's completed kv-gets (its engine link)
        self.costs = FixedCosts(node.cfg.rate_ewma_alpha)  # learnt fixed costs (pin, deliver, per source and kind)
        self.ingest = LineFit(node.cfg.rate_ewma_alpha)  # the pin's time over the bytes it fetched (its own upstream GETs last)
        self.answered = 0
        self.recent: deque[dict[str, object]] = deque(maxlen=32)  # the latest kv-gets' predicted and measured split (status)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self.node.chunks.up.requests.full = self.node.chunks.concurrency  # the store's rate at a pin's GETs at once
        self.kv.observers.append(self._delivered)
        self.kv.forecaster = self
        if self.node.fetcher is not None:
            self.node.fetcher.load = self.load  # the kv-gets' path choices see this node's live links
        self._task = asyncio.ensure_future(self._refreshing())

    def close(self) -> None:
        self.kv.forecaster = None
        if self._task is not None:
            self._task.cancel()

    # -- telemetry -------------------------------------------------------------------
    @property
    def me(self) -> NodeInfo:
        assert self.node.me is not None, "the cluster node has not started"
        return self.node.me

    def _delivered(self, info: TransferInfo, outcome: str, stats: TransferStats | None) -> None:
        if outcome == "ok" and stats is not None and stats.total_s > 0:
            self.delivered[0] += stats.payload_bytes
            self.delivered[1] += stats.total_s
        f = info.forecast
        if outcome == "ok" and stats is not None and isinstance(f, NodeForecast):
            self.recent.append({"request_id": info.request_id, "plan": [list(p) for p in f.plan], "critical": f.critical,
                                "fetch_s": round(f.fetch_s, 6), "predicted_fetch_s": round(f.predicted_fetch_s, 6),
                                "first_layer_s": round(stats.setup_s + stats.first_layer_s, 6),
                                "predicted_first_layer_s": round(f.first_layer_s, 6)})
            if f.critical == f"upstream@{self.me.node_id}" and f.fetched_bytes > 0:
                # Its own GETs set the pin's end: the time per byte of everything it fetched, whichever link brought
                # each share (a share from a peer is landed beside them). A peer's pace sets no sample: that link is known.
                self.ingest.add(f.fetched_bytes, f.fetch_s - f.heads_s)
            self.costs.observe(f.fetch_s, stats.setup_s + stats.first_layer_s, f.predicted_fetch_s, f.first_layer_s,
                               f.critical, f.critical_cost_s, f.teaches, f.heads, f.heads_s)

    async def _refreshing(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.estimate_refresh_s)
            self.refresh()

    def refresh(self) -> None:
        me = self.me
        tally = self.node.fetcher.tally if self.node.fetcher is not None else None
        totals: dict[str, tuple[float, float]] = {engine_link(me.node_id, host_of(me)): (self.delivered[0], self.delivered[1])}
        if tally is not None:
            totals |= {peer_link(p, me.node_id): (float(b), tally.flow_s.get(p, 0.0)) for p, b in tally.flow_bytes.items()}
        up = self.node.chunks.up.requests  # the store's GETs and HEADs (to their first byte) per busy second
        totals[UPSTREAM_REQUESTS] = (float(up.done), up.busy_s)
        self.telemetry.refresh(totals)
        self.refreshed_at = time.monotonic()

    def load(self) -> NodeLoad:
        """This node's links now: measured rates, in-flight bytes (kv-gets to its engines, peer streams into it)
        and the bandwidth pool's capacity for its engine link when the pool is on."""
        me = self.me
        eng = engine_link(me.node_id, host_of(me))
        flows: dict[str, tuple[float, ...]] = {eng: tuple(float(t.descriptor.payload_bytes) for t in list(self.kv.active.values()))}
        if self.node.fetcher is not None:
            flows |= {peer_link(p, me.node_id): (float(q),) for p, q in self.node.fetcher.tally.inflight.items() if q > 0}
        capacity = {eng: self.kv.pool.scheduler.capacity} if self.kv.pool is not None else {}
        line, records_s = self.ingest_line(), self.records_s
        return NodeLoad(dict(self.telemetry.rates), flows, capacity, time.monotonic() - self.refreshed_at, dict(self.costs.seconds),
                        None if line is None else 1.0 / line[1],
                        records_s if line is None else max(records_s, line[0] - self.tiers.upstream.latency_s), None if line is None else line[0])

    @property
    def records_s(self) -> float:
        """What a pin of cached chunks costs before it touches one: the store's record reads (a local kv-get over an s3
        store is one upstream round trip, 85% of its pin's samples, py-spy), as measured, else one GET's first byte."""
        measured = self.node.chunks.record_s
        return self.tiers.upstream.latency_s if measured is None else measured

    def ingest_line(self) -> tuple[float, float] | None:
        """``(intercept s, slope s/byte)`` of this node's pins' time over their fetched bytes (its landing rate is 1/slope),
        anchored (until sizes vary) at what a fetch of nothing costs: a pin (its learnt time, else its record reads) and one
        GET's first byte."""
        return self.ingest.line(self.costs.seconds.get("pin", self.records_s) + self.tiers.upstream.latency_s)

    def nodes(self) -> dict[str, NodeInfo]:
        live = self.node.members.live() if self.node.members is not None else []
        return {n.node_id: n for n in [self.me, *live]}

    # -- kv-estimate -----------------------------------------------------------------
    async def rpc(self, call: RpcCall) -> Reply:
        try:
            body = json.loads(call.body or b"null")
        except ValueError:
            raise S3Error(ErrorCode.InvalidRequest, "The kv-estimate body must be a JSON object.") from None
        req = EstimateRequest.from_json(body).check()
        reply = await self.estimate(call.field("tenant"), call.field("bucket"), str(call.request.fields.get("request_id", "")), req)
        return reply.to_json()

    async def estimate(self, tenant: str, bucket: str, request_id: str, req: EstimateRequest) -> EstimateReply:
        for key in req.keys:
            check_key(bucket, key)
        nodes = self.nodes()
        targets = [resolve(h, nodes) for h in req.candidates]  # unknown hosts refused before any peer is asked
        chunks = self.node.chunks
        bucket_id = await chunks.store.bucket_id(bucket)
        sizes = [chunks.cached_size(bucket_id, k) for k in req.keys]
        local = next((i for i, (_, size) in enumerate(sizes) if size is None), len(req.keys))
        stale = stale_count(chunks.files.confirmed, [cid for cid, size in sizes if size is not None], chunks.revalidate_after_s, time.monotonic())
        revalidate_s = self._revalidation_s(stale, self.load())
        warm = {self.me.node_id: local}
        if self.node.fetcher is not None and local < len(req.keys):
            warm |= await self.node.fetcher.warm_on_peers(tenant, bucket, bucket_id, req.keys, request_id)
        load = self.load()
        n = len(req.keys)
        want = PathRequest(n, float(req.chunk_bytes), req.num_layers)
        answers = []
        for host, target in zip(req.candidates, targets):
            # Another node's links: configured only (its measurements are its own); the learnt fixed costs of kinds apply
            # to it too, not those of this node's own sources.
            mine = load if target.node_id == self.me.node_id else NodeLoad(startup_s={
                k: v for k, v in load.startup_s.items() if k in ("pin", "deliver", "fetch", "peer", "upstream")})
            fetcher = self.node.fetcher
            if target.node_id == self.me.node_id and fetcher is not None:  # exactly what a kv-get here would do
                view = fetcher.view(warm, n, float(req.chunk_bytes), revalidate_s=revalidate_s)
                choice = fetcher.choose(want, view)
            else:
                view = build_view(target, nodes, warm, n, self.tiers, mine, self.cfg.estimate_stale_after_s, chunk_bytes=float(req.chunk_bytes),
                                  relay_batch_chunks=FILL_BATCH)
                choice = choose_path(want, view)
            answers.append(candidate_estimate(host, dict(warm), choice, view))
        self.answered += 1
        return EstimateReply(n, req.chunk_bytes, req.num_layers, round(load.age_s, 6), answers)

    # -- each kv-get's prediction ----------------------------------------------------------
    def snapshot(self, request_id: str = "") -> tuple[NodeLoad, float, str, int]:
        """The link picture when a kv-get arrives, and when (its pin's time is measured from here to :meth:`forecast`), and
        the cache's count of revalidating HEADs so far (the pin's own are the difference)."""
        return self.load(), time.perf_counter(), request_id, self._revalidated()

    def _revalidated(self) -> int:
        return self.node.chunks.revalidated

    def forecast(self, snapshot: tuple[NodeLoad, float, str, int], d: Descriptor, paths: Mapping[str, int]) -> "NodeForecast":
        """The oracle's prediction for a kv-get whose pin has just taken its chunks over ``paths`` (from the link picture at
        its arrival), with what its fixed costs learn from: the pin's measured time and the source that ended it."""
        load, t0, request_id, heads = snapshot
        fetch_s = time.perf_counter() - t0
        heads = self._revalidated() - heads
        revalidate_s = self._revalidation_s(heads, load)
        n = len(d.chunk_keys)
        moves = self.node.fetcher.taken.pop(request_id, None) if self.node.fetcher is not None else None
        warm, plan, helpers = taken_plan(self.me.node_id, paths, n, moves)
        view = build_view(self.me, self.nodes(), warm, n, self.tiers, load, self.cfg.estimate_stale_after_s,
                          chunk_bytes=float(d.chunk_object_bytes), helpers=helpers, relay_batch_chunks=FILL_BATCH,
                          revalidate_s=revalidate_s)
        choice = predict(PathRequest(n, float(d.chunk_object_bytes), d.num_layers), view, plan)
        pin = load.startup_s.get("pin", load.pin_prior_s) + revalidate_s
        ended, critical = fetch_phase(choice, view)
        cost, teaches = 0.0, None
        if critical is not None:
            helper = critical.startswith("upstream@") and critical != f"upstream@{self.me.node_id}"
            line_up = line_upstream_s(load, self.tiers.upstream.latency_s)
            cost = fixed_cost(load.startup_s, critical, helper_prior(load.startup_s, line_up) if helper else None)
            if critical == f"upstream@{self.me.node_id}" and line_up is not None:  # what the line's start put in
                cost = line_up
            teaches = None if helper else ("peer" if critical.startswith("peer:") else "upstream")
        fetched = sum(b - a for source, a, b in plan if source != "local") * float(d.chunk_object_bytes)
        return NodeForecast(choice.first_layer_s, choice.total_s, fetch_s, ended if critical is not None else pin,
                            critical, cost, teaches, heads, revalidate_s, tuple(plan), fetched)

    def _revalidation_s(self, heads: int, load: NodeLoad) -> float:
        """``heads`` revalidating HEADs: at one HEAD's learnt time, else at the store's measured rate, else configured."""
        if "revalidate" in load.startup_s:
            return heads * load.startup_s["revalidate"]
        return self.tiers.revalidation_s(heads, load.rates.get(UPSTREAM_REQUESTS))

    def status(self) -> dict[str, object]:
        rates = dict(self.telemetry.rates)
        store = rates.pop(UPSTREAM_REQUESTS, None)
        return {"answered": self.answered, "measured_bytes_per_s": {k: round(v) for k, v in rates.items()},
                "upstream_requests_per_s": None if store is None else round(store, 3),
                "telemetry_age_s": round(time.monotonic() - self.refreshed_at, 3),
                "record_s": None if (rec := self.node.chunks.record_s) is None else round(rec, 6),
                "startup_s": {k: round(v, 6) for k, v in self.costs.seconds.items()},
                "ingest_bytes_per_s": None if (line := self.ingest_line()) is None else round(1.0 / line[1]), "recent": list(self.recent)}


def stale_count(confirmed: Mapping[str, float], cids: list[str], after_s: float, now: float) -> int:
    """Cached chunks a pin would check with the upstream first (not confirmed within ``after_s`` of ``now``)."""
    return sum(1 for cid in cids if now - confirmed.get(cid, -math.inf) >= after_s)


@dataclass(frozen=True)
class NodeForecast(Forecast):
    """A kv-get's prediction and what its learning needs: the pin's measured and predicted time, and the fetched source
    whose end set the pin's (its fixed cost in the prediction, and the kind it also teaches)."""

    fetch_s: float = 0.0
    predicted_fetch_s: float = 0.0
    critical: str | None = None
    critical_cost_s: float = 0.0
    teaches: str | None = None
    heads: int = 0  # revalidating HEADs the pin sent ...
    heads_s: float = 0.0  # ... and their predicted time
    plan: tuple[tuple[str, int, int], ...] = ()  # what the pin did: (source, first chunk, end) per share
    fetched_bytes: float = 0.0  # of those shares but this node's own cache's


def resolve(host: str, nodes: Mapping[str, NodeInfo]) -> NodeInfo:
    """The live node a candidate host names (its ``host`` label or node id); InvalidArgument naming ``candidates`` if none."""
    for node in nodes.values():
        if host in (node.host, node.node_id):
            return node
    raise S3Error(ErrorCode.InvalidArgument, f"candidates: unknown host {host[:80]!r} (neither the host label nor the node id "
                  "of a live node of this cluster)", extra={"ArgumentName": "candidates", "ArgumentValue": host[:253]})
