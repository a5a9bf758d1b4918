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

A ``store_and_forward`` source (a cluster node fetching into its cache before it delivers) is timed in two
phases: its fetch over its links but the last, then — once every such part of the request has landed, the
split point balancing the fetches — the delivery of all the request's chunks over the last link, after the
node's fixed ``deliver_s``; a ``relay_at`` hop (a helper's cache) stores the bytes before forwarding them.

An engine still busy with the requests ahead of this one (``engine_busy_s``)
needs the bytes only when it gets to it: paths that deliver by then tie, and
the tie goes to the emptier path, leaving the fast one to requests that need it.

With ``max_segments`` above two, the back of the best plan is then shared among more sources that
hold everything (the upstream through other nodes' links: DualPath's second storage path, several
peers holding the whole prefix), one more at a time while that lowers the prediction, the shares
balanced so they finish together (:func:`_balanced`). A source marked ``whole_only`` (a peer that
would stream the whole kv-get straight to the engine) is never part of a split.

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
    whole_only: bool = False  # serves the whole request or none of it (never one side of a split)
    # Its links but the last fetch the chunks into the destination's node; delivery over the last link starts once
    # every such part of the request has landed (the node pins all its chunks first), after ``deliver_s``.
    store_and_forward: bool = False
    deliver_s: float = 0.0  # fixed cost of that delivery (the node's own kv-get: gateway, pin, first read)
    relay_at: int = 0  # >0: the fetch stores the bytes at this link index before moving on (a helper's cache) ...
    relay_batch_chunks: int = 0  # ... this many chunks at a time (0: all of its share)


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
    fetched_s: float = 0.0  # its chunks are in the destination's node (store-and-forward), else its delivery ended


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


def choose_path(request: PathRequest, view: OracleView, allow_split: bool = True, max_segments: int = 2) -> PathChoice:
    """The fastest single path or split for ``request`` (raises :class:`NoPath` when none can serve it).

    ``max_segments``: at most this many sources at once (2: a single path or a two-way split)."""
    n, first = request.num_chunks, request.first_chunk
    live = [s for s in view.sources if s.alive and all(link in view.links for link in s.links)]
    if first == n:
        return _evaluate(request, view, [])
    full = [s for s in live if s.warm_chunks >= n]
    if not full:
        raise NoPath(f"no live source holds chunks {first}..{n - 1}")
    options = [_evaluate(request, view, [(s, first, n)]) for s in full]
    if allow_split and max_segments >= 2:
        for front in live:
            if front.warm_chunks <= first or front.whole_only:
                continue
            for back in full:
                if back.name != front.name and not back.whole_only:
                    options.append(_best_split(request, view, front, back))
    if not allow_split or max_segments <= 2:
        return _pick(options)
    families: dict[str, list[PathChoice]] = {}  # by warm front (none: "")
    for o in options:
        front = o.segments[0].source if o.segments and _front_of(request, view, o) else ""
        families.setdefault(front, []).append(o)
    widened = []
    for family in families.values():
        best = _pick(family)
        while len(best.segments) < max_segments:
            wider = _widen(request, view, best, full)
            if wider is None or not wider.ttft_s < best.ttft_s * (1 - TIE_RELATIVE) - 1e-12:
                break
            best = wider
        widened.append(best)
    return _pick(widened)


def _front_of(request: PathRequest, view: OracleView, choice: PathChoice) -> bool:
    """Whether ``choice`` starts with a warm front (a source not holding everything)."""
    first = next(s for s in view.sources if s.name == choice.segments[0].source)
    return first.warm_chunks < request.num_chunks


def _widen(request: PathRequest, view: OracleView, choice: PathChoice, full: list[Source]) -> PathChoice | None:
    """``choice`` with one more full source sharing its back (the segments from sources holding everything), or None."""
    by_name = {s.name: s for s in view.sources}
    segs = list(choice.segments)
    front = segs[:1] if segs and _front_of(request, view, choice) else []
    group = [by_name[s.source] for s in segs[len(front):]]
    if not group or any(s.whole_only for s in group):
        return None
    fixed = [(by_name[s.source], s.first_chunk, s.end_chunk) for s in front]
    start = segs[len(front)].first_chunk
    used = {s.source for s in segs}
    trials = [_balanced(request, view, fixed, [*group, extra], start) for extra in full if extra.name not in used and not extra.whole_only]
    return _pick(trials) if trials else None


def _balanced(request: PathRequest, view: OracleView, fixed: list[tuple[Source, int, int]], group: list[Source], start: int) -> PathChoice:
    """Chunks ``[start, n)`` shared among ``group`` so their segments finish together, after the ``fixed`` parts.

    Each source is modelled as a start-up ``L_i`` then a rate ``r_i`` (read off its last prediction); the
    shares ``c_i = r_i (T - L_i)`` that sum to the chunks left are re-evaluated a few times, since sources
    sharing a link slow each other; the best evaluated plan is kept."""
    n = request.num_chunks
    m = n - start
    counts = [m // len(group) + (1 if i < m % len(group) else 0) for i in range(len(group))]
    tried: list[PathChoice] = []
    for _ in range(4):
        plan = _plan(group, counts, start)
        choice = _evaluate(request, view, fixed + plan)
        tried.append(choice)
        times = {s.source: s.fetched_s for s in choice.segments}
        latency, rate = [], []
        for src, c in zip(group, counts):
            lat = _lead_s(view, src)
            if c > 0:
                r = c / max(times[src.name] - lat, 1e-12)
            else:  # unused so far: its rate for one chunk alone beside the others
                one = _evaluate(request, view, fixed + _plan(group, [1 if s is src else k for s, k in zip(group, counts)], start))
                r = 1 / max({s.source: s.fetched_s for s in one.segments}[src.name] - lat, 1e-12)
            latency.append(lat)
            rate.append(r)
        counts = _shares(m, latency, rate)
    return _pick(tried)


def _plan(group: list[Source], counts: list[int], start: int) -> list[tuple[Source, int, int]]:
    parts, at = [], start
    for src, c in zip(group, counts):
        if c > 0:
            parts.append((src, at, at + c))
            at += c
    return parts


def _shares(m: int, latency: list[float], rate: list[float]) -> list[int]:
    """Whole shares summing to ``m`` with ``c_i = r_i (T - L_i)``, sources that would start after ``T`` left out
    (largest remainders rounded up, the earlier source first among equals)."""
    active = list(range(len(rate)))
    while True:
        total_rate = sum(rate[i] for i in active)
        t = (m + sum(rate[i] * latency[i] for i in active)) / total_rate
        late = [i for i in active if latency[i] >= t]
        if not late or len(active) == 1:
            break
        active = [i for i in active if i not in late]
    exact = [rate[i] * (t - latency[i]) if i in active else 0.0 for i in range(len(rate))]
    counts = [max(0, int(x)) for x in exact]
    for i in sorted(active, key=lambda i: (-(exact[i] - int(exact[i])), i))[:m - sum(counts)]:
        counts[i] += 1
    return counts


def peer_first(request: PathRequest, view: OracleView) -> PathChoice:
    """No choice (the baseline a node runs with ``cluster.path_choice = "peer-first"``): the live cache holding the
    longest warm run past ``first_chunk`` serves it (the nearer tier, then the name, among equals), the first upstream
    source in the view the rest; no splits beyond that, no link rates."""
    n, first = request.num_chunks, request.first_chunk
    live = [s for s in view.sources if s.alive and all(link in view.links for link in s.links)]
    caches = [s for s in live if s.kind != SourceKind.UPSTREAM and min(s.warm_chunks, n) > first and (not s.whole_only or s.warm_chunks >= n)]
    parts: list[tuple[Source, int, int]] = []
    at = first
    if caches:
        holder = min(caches, key=lambda s: (-min(s.warm_chunks, n), view.links[s.links[0]].tier if s.links else 0, s.name))
        at = min(holder.warm_chunks, n)
        parts.append((holder, first, at))
    if at < n:
        up = next((s for s in live if s.kind == SourceKind.UPSTREAM and s.warm_chunks >= n and not s.whole_only), None)
        if up is None:
            raise NoPath(f"no live source holds chunks {at}..{n - 1}")
        parts.append((up, at, n))
    return _evaluate(request, view, parts)


def predict(request: PathRequest, view: OracleView, plan: Sequence[tuple[str, int, int]]) -> PathChoice:
    """The prediction for a plan already fixed (what a node's fetcher did): ``(source name, first, end)`` parts."""
    by_name = {s.name: s for s in view.sources}
    return _evaluate(request, view, [(by_name[name], a, b) for name, a, b in plan if b > a])


def fetch_phase(choice: PathChoice, view: OracleView) -> tuple[float, str | None]:
    """When a choice's store-and-forward parts have all landed (its delivery waits for that), and the source that lands
    last (None, at 0.0: nothing is fetched)."""
    saf = {s.name for s in view.sources if s.store_and_forward}
    last = max((s for s in choice.segments if s.source in saf), key=lambda s: s.fetched_s, default=None)
    return (0.0, None) if last is None else (last.fetched_s, last.source)


def schedule_batch(requests: Sequence[PathRequest], view: OracleView, allow_split: bool = True,
                   max_segments: int = 2) -> tuple[list[PathChoice], OracleView]:
    """Place requests one after another, each seeing the flows of those placed before it; returns the new view."""
    choices = []
    for r in requests:
        choice = choose_path(r, view, allow_split, max_segments)
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
        times = {s.source: s.fetched_s for s in plan(mid).segments}
        if times[front.name] < times[back.name]:
            lo = mid
        else:
            hi = mid
    return _pick([plan(lo), plan(hi)])


def _stage_s(view: OracleView, links: Sequence[str], link_bytes: Mapping[str, float], fraction: float) -> float:
    """Pipelined links: their latencies, then the slowest one for ``fraction`` of this request's bytes on each."""
    if not links:
        return 0.0
    return (sum(view.links[k].latency_s for k in links)
            + max(ps_seconds(view.links[k], link_bytes[k] * fraction, view.stale_after_s) for k in links))


def _fetch_s(view: OracleView, source: Source, chunks: int, link_bytes: Mapping[str, float]) -> float:
    """When a store-and-forward part's chunks are all in the destination's node: its start-up, then its fetch links
    (pipelined; with ``relay_at``, the bytes stored there first and forwarded a batch at a time: the later of the
    first stage's end plus the last batch's forwarding and the first batch's arrival plus the whole forwarding)."""
    fetch = source.links[:-1]
    if not 0 < source.relay_at < len(fetch):
        return source.startup_s + _stage_s(view, fetch, link_bytes, 1.0)
    into, onward = fetch[:source.relay_at], fetch[source.relay_at:]
    batch = 1.0 if source.relay_batch_chunks <= 0 else min(1.0, source.relay_batch_chunks / max(chunks, 1))
    return source.startup_s + max(_stage_s(view, into, link_bytes, 1.0) + _stage_s(view, onward, link_bytes, batch),
                                  _stage_s(view, into, link_bytes, batch) + _stage_s(view, onward, link_bytes, 1.0))


def _lead_s(view: OracleView, source: Source) -> float:
    """A source's fixed time before its bytes flow: start-up and the latencies of the links it is timed over."""
    links = source.links[:-1] if source.store_and_forward else source.links
    return source.startup_s + sum(view.links[k].latency_s for k in links)


def _evaluate(request: PathRequest, view: OracleView, parts: list[tuple[Source, int, int]]) -> PathChoice:
    """Predict a plan: each part's bytes cross its source's links; parts sharing a link share it.

    Store-and-forward parts fetch first; the destination's node delivers over their last link once the slowest of
    them has landed (its ``deliver_s`` later), and so do the other parts ending on that link (its own cache)."""
    stale = view.stale_after_s
    link_bytes: dict[str, float] = {}
    for source, a, b in parts:
        for link in source.links:
            link_bytes[link] = link_bytes.get(link, 0.0) + (b - a) * request.chunk_bytes
    fetched = [_fetch_s(view, s, b - a, link_bytes) if s.store_and_forward and s.links else None for s, a, b in parts]
    gated = {s.links[-1] for (s, _, _), f in zip(parts, fetched) if f is not None}
    gate = max((f for f in fetched if f is not None), default=0.0)
    deliver = gate + max((s.deliver_s for (s, _, _), f in zip(parts, fetched) if f is not None), default=0.0)
    segments = []
    for (source, a, b), ready in zip(parts, fetched):
        tail, start = source.links, source.startup_s
        if ready is not None:  # delivered from the node's cache once the pin has every chunk
            tail, start = source.links[-1:], deliver
        elif source.links and source.links[-1] in gated:  # the node's own cache, delivered with the fetched parts
            ready, start = source.startup_s, max(source.startup_s, deliver)
        first = start + _stage_s(view, tail, link_bytes, 1 / request.num_layers)
        total = start + _stage_s(view, tail, link_bytes, 1.0)
        segments.append(Segment(source.name, a, b, first, total, total if ready is None else ready))
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
