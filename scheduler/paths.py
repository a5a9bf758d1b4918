"""The path scheduler: for one kv-get, the path or split that minimises predicted TTFT (pure, no I/O).

A destination engine wants chunks ``[first_chunk, num_chunks)`` of a prefix (the
ones before ``first_chunk`` it already has). Each :class:`Source` holds the
prefix's leading ``warm_chunks`` (the local cache, a peer's cache) or all of it
(the upstream through some node), and reaches the engine over a list of links
in the :class:`OracleView`. :func:`choose_path` predicts, with the oracle's
cost model, every single source and every two-way split (a source holding a
warm front serves ``[first, a)`` while one holding the rest serves ``[a, N)``,
``a`` chosen so both halves finish together) and returns the fastest.

Queues are balanced across paths as DualPath does, but by predicted time
rather than queue length alone: a link's in-flight bytes (self-contention)
and its congestion enter the prediction, so a request goes to the side that
will drain first, and :func:`schedule_batch` adds each choice's flows to the
view before the next request is placed. A request's rate on a link comes
out of that link's pool: what is left after background traffic and the
allocator's reservations is shared fairly among the flows on it, re-shared
when one joins (``PathChoice.link_rates`` is this request's part at admission),
so no prediction moves bytes faster than the links' pools allow.

An engine still busy with the requests ahead of this one (``engine_busy_s``)
needs the bytes only when it gets to it: paths that deliver by then tie, and
the tie goes to the emptier path, leaving the fast one to requests that need it.

Ties (predictions within ``TIE_RELATIVE``) go to the path whose busiest link
drains soonest (DualPath's shorter read queue, in time rather than bytes), then
fewer segments, then the nearer kind of source (local, peer, upstream),
then the name, so the answer is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import IntEnum

from .oracle import LinkView, fair_share, modelled_ttft, ps_seconds

TIE_RELATIVE = 1e-9


class SourceKind(IntEnum):
    LOCAL = 0  # the destination's own node
    PEER = 1  # another node's cache
    UPSTREAM = 2  # the object store, through some node


@dataclass(frozen=True)
class Source:
    """One place the chunks can come from and the links from it to the destination engine, in order."""

    name: str
    kind: SourceKind
    warm_chunks: int  # leading chunks it can serve (an upstream: all of them)
    links: tuple[str, ...]
    alive: bool = True  # False: the peer is gone (no heartbeat); never chosen
    startup_s: float = 0.0  # before the first byte moves (e.g. an upstream's first-byte time)


@dataclass(frozen=True)
class PathRequest:
    """One kv-get: ``num_chunks`` chunks of ``chunk_bytes`` (all layers) each, layer by layer."""

    num_chunks: int
    chunk_bytes: float
    num_layers: int
    first_chunk: int = 0  # chunks before this are already in the engine's memory
    compute_per_layer_s: float = 0.0  # the engine's compute window per layer (0: TTFT = delivery)
    engine_busy_s: float = 0.0  # the engine cannot start on this request sooner (its queue ahead)

    def __post_init__(self) -> None:
        if not 0 <= self.first_chunk <= self.num_chunks:
            raise ValueError("first_chunk must be within 0..num_chunks")
        if self.chunk_bytes < 0 or self.num_layers < 1 or self.engine_busy_s < 0:
            raise ValueError("chunk_bytes and engine_busy_s must be >= 0 and num_layers >= 1")


@dataclass(frozen=True)
class OracleView:
    """The oracle's picture at one moment: the sources of one prefix and every link they use."""

    sources: tuple[Source, ...]
    links: Mapping[str, LinkView]
    stale_after_s: float = math.inf  # telemetry older than this is ignored (static tier map only)


@dataclass(frozen=True)
class Segment:
    source: str
    first_chunk: int
    end_chunk: int  # exclusive
    first_layer_s: float
    total_s: float


@dataclass(frozen=True)
class PathChoice:
    """The chosen path (one segment) or split (two), with its predictions and its part of each link."""

    segments: tuple[Segment, ...]
    first_layer_s: float
    total_s: float
    ttft_s: float
    link_rates: Mapping[str, float]  # bytes/s this request takes on each link it uses, at admission
    link_bytes: Mapping[str, float]  # bytes it will move over each link
    queued_bytes: float  # our in-flight bytes already on its links
    kind: SourceKind  # the farthest kind of source it uses
    drain_s: float = 0.0  # until its busiest link has carried everything queued there and this request's bytes

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(s.source for s in self.segments)


class NoPath(ValueError):
    """No live source holds the chunks the request needs."""


def choose_path(request: PathRequest, view: OracleView, allow_split: bool = True) -> PathChoice:
    """The fastest single path or two-way split for ``request`` (raises :class:`NoPath` when none can serve it)."""
    n, first = request.num_chunks, request.first_chunk
    live = [s for s in view.sources if s.alive and all(link in view.links for link in s.links)]
    if first == n:
        return _evaluate(request, view, [])
    full = [s for s in live if s.warm_chunks >= n]
    if not full:
        raise NoPath(f"no live source holds chunks {first}..{n - 1}")
    options = [_evaluate(request, view, [(s, first, n)]) for s in full]
    if allow_split:
        for front in live:
            if front.warm_chunks <= first:
                continue
            for back in full:
                if back.name != front.name:
                    options.append(_best_split(request, view, front, back))
    return _pick(options)


def predict(request: PathRequest, view: OracleView, plan: Sequence[tuple[str, int, int]]) -> PathChoice:
    """The prediction for a plan already fixed (what a node's fetcher did): ``(source name, first, end)`` parts."""
    by_name = {s.name: s for s in view.sources}
    return _evaluate(request, view, [(by_name[name], a, b) for name, a, b in plan if b > a])


def schedule_batch(requests: Sequence[PathRequest], view: OracleView, allow_split: bool = True) -> tuple[list[PathChoice], OracleView]:
    """Place requests one after another, each seeing the flows of those placed before it; returns the new view."""
    choices = []
    for r in requests:
        choice = choose_path(r, view, allow_split)
        choices.append(choice)
        view = with_choice(view, choice)
    return choices, view


def with_choice(view: OracleView, choice: PathChoice) -> OracleView:
    """The view after ``choice`` starts: its bytes are one more flow on each link it crosses."""
    links = dict(view.links)
    for name, nbytes in choice.link_bytes.items():
        links[name] = links[name].with_flow(nbytes)
    return replace(view, links=links)


def _best_split(request: PathRequest, view: OracleView, front: Source, back: Source) -> PathChoice:
    """``front`` serves ``[first, a)``, ``back`` ``[a, n)``: binary search for the ``a`` where the slower half is fastest."""
    first, n = request.first_chunk, request.num_chunks
    lo, hi = first, min(front.warm_chunks, n)  # a in [lo, hi]; the front's time grows with a, the back's shrinks

    def plan(a: int) -> PathChoice:
        parts = [(front, first, a), (back, a, n)]
        return _evaluate(request, view, [p for p in parts if p[2] > p[1]])

    while hi - lo > 1:
        mid = (lo + hi) // 2
        times = {s.source: s.total_s for s in plan(mid).segments}
        if times[front.name] < times[back.name]:
            lo = mid
        else:
            hi = mid
    return _pick([plan(lo), plan(hi)])


def _evaluate(request: PathRequest, view: OracleView, parts: list[tuple[Source, int, int]]) -> PathChoice:
    """Predict a plan: each part's bytes cross its source's links; parts sharing a link share it."""
    stale = view.stale_after_s
    link_bytes: dict[str, float] = {}
    for source, a, b in parts:
        for link in source.links:
            link_bytes[link] = link_bytes.get(link, 0.0) + (b - a) * request.chunk_bytes
    segments = []
    for source, a, b in parts:
        latency = source.startup_s + sum(view.links[link].latency_s for link in source.links)
        total = first = latency
        for link in source.links:  # pipelined hops: the slowest link (for all this request's bytes on it) sets the pace
            mine = link_bytes[link]
            total = max(total, latency + ps_seconds(view.links[link], mine, stale))
            first = max(first, latency + ps_seconds(view.links[link], mine / request.num_layers, stale))
        segments.append(Segment(source.name, a, b, first, total))
    first_layer = max((s.first_layer_s for s in segments), default=0.0)
    total = max((s.total_s for s in segments), default=0.0)
    rates: dict[str, float] = {}
    for source, a, b in parts:  # a segment's rate is its share of its bottleneck; it takes that on every link it crosses
        if b > a and source.links:
            rate = min(fair_share(view.links[link], stale, _own_flows(parts, link)) for link in source.links)
            for link in source.links:
                rates[link] = rates.get(link, 0.0) + rate
    kind = max((s.kind for s, _, _ in parts), default=SourceKind.LOCAL)
    busy = request.engine_busy_s  # bytes that land while the engine is still busy cost nothing
    return PathChoice(tuple(segments), first_layer, total,
                      modelled_ttft(max(first_layer, busy), max(total, busy), request.num_layers, request.compute_per_layer_s),
                      rates, link_bytes, sum(view.links[link].queued_bytes for link in link_bytes), kind,
                      max(((view.links[k].queued_bytes + b) / view.links[k].effective_bytes_per_s(stale) for k, b in link_bytes.items()),
                          default=0.0))


def _own_flows(parts: list[tuple[Source, int, int]], link: str) -> int:
    return sum(1 for s, a, b in parts if b > a and link in s.links)


def _pick(options: list[PathChoice]) -> PathChoice:
    best = min(o.ttft_s for o in options)
    tied = [o for o in options if o.ttft_s <= best * (1 + TIE_RELATIVE) + 1e-12]
    return min(tied, key=lambda o: (o.drain_s, len(o.segments), o.kind, o.sources))
