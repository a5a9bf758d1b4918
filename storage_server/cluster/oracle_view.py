"""The oracle's picture of one candidate destination, built from what a node knows (pure: no I/O, no clocks).

A candidate host is served by the cluster node beside it (the engine sends its kv-gets to its
local node), so every path ends on that node's link to the engine:

* ``local`` — the node's own cache: ``<node>-><host>`` (same host);
* ``peer:<W>`` — a peer's cache through the node: ``<W>-><node>`` (the tier between their topology
  labels), then ``<node>-><host>``;
* ``upstream@<node>`` — the upstream store through the node: ``upstream-><node>``, then ``<node>-><host>``;
* ``upstream@<W>`` (a helper: ``cluster.cold_split_peers``) — the upstream through peer W's link and cache:
  ``upstream-><W>``, ``<W>-><node>``, ``<node>-><host>``;
* ``direct:<W>`` (``cluster.direct_from_peers``) — a peer holding the whole prefix streams it straight to
  the engine: ``<W>-><host>`` alone; whole or nothing (a ticket serves the whole kv-get).

The upstream is an object store read one GET per chunk, ``cache.fetch_concurrency`` at a time: each GET
costs its first-byte time before its bytes flow, so for chunks of ``s`` bytes a node's upstream link
carries ``1 / (first_byte / (streams·s) + 1 / bandwidth)`` bytes/s (:meth:`TierMap.upstream_rate`): small
chunks are bound by request latency, large ones by bandwidth. The first GET's first byte starts the source.
With ``cluster.upstream_store_streams`` set, every node's GETs also cross one shared ``upstream`` link (the
store serving that many GETs at once), so shares of a cold miss over several nodes' links compete there.

A node fetches every chunk it misses into its cache before the kv-get's first layer moves on (the
pin precedes the transfer), so peer and upstream sources are ``store_and_forward``: their links
but the engine's fetch, and the kv-get's delivery over the engine link (its own cache's chunks
too) starts when the slowest of them has landed. A helper's share is stored in the helper's cache
and then streamed here, a fill batch (``relay_batch_chunks``) at a time, never pipelined.

Each link's bandwidth and latency come from the static tier map (``[cluster]`` config); a link this
node measures (its peers' streams into it, its own deliveries to its engines) has the EWMA of its
achieved rate (:class:`Telemetry`), which replaces the configured bandwidth while fresh; the
node's in-flight bytes on a link are its flows (self-contention). What the links do not explain — the
fixed costs of a request — is learnt online from the node's own kv-gets (:class:`FixedCosts`), split
as the node's END statistics and its clock split them: ``pin`` (taking a kv-get's chunks when none
is missing), ``deliver`` (from the pin to the first layer, less the engine link's time: every kv-get
teaches it), and per source of the fetch (``peer:<W>``, ``upstream@<W>``; a source not yet measured
starts from its kind's, ``peer`` or ``upstream``, and a kind from ``fetch``, what every fetched share pays:
the lookup, the grant, the set-up) from the pin's time less the links' (the residual goes to the source
that set the fetch's end).

A node also learns one line for its pins that its own GETs ended: time = fixed part + fetched bytes ×
time per byte (:class:`scheduler.oracle.LineFit`). Its rate is ``ingest-><node>``, a link every fetched
share crosses (measured: a peer's share beside the upstream's added no throughput, the node's landing
bound both), and the store's links take it too; its fixed part starts the node's own upstream share
(a residual-learnt cost would take a big fetch's noise to every size) and, less a GET's first byte,
stands for ``pin`` until a pin with nothing to fetch has taught it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from protocol.cluster import NodeInfo
from protocol.config import ClusterConfig
from scheduler.oracle import GBPS, LinkView, Placement, Tier, TierLink, ewma, tier_between
from scheduler.paths import OracleView, Source, SourceKind

UPSTREAM_TIER = Tier.CROSS_ZONE  # the upstream is reported as the farthest tier
STORE_LINK = "upstream"  # the store itself, when its GETs at once for all nodes are limited (cluster.upstream_store_streams)
UPSTREAM_REQUESTS = "upstream-requests"  # telemetry: the store's achieved GETs and HEADs per busy second, as this node sees it


def engine_link(node_id: str, host: str) -> str:
    return f"{node_id}->{host}"


def peer_link(source: str, node_id: str) -> str:
    return f"{source}->{node_id}"


def ingest_link(node_id: str) -> str:
    """A node's landing of fetched chunks into its cache: every share it fetches crosses it, whichever link brought it."""
    return f"ingest->{node_id}"


def upstream_link(node_id: str) -> str:
    return f"upstream->{node_id}"


def host_of(node: NodeInfo) -> str:
    """The host a node's engines run on: its ``host`` label, else its node id."""
    return node.host or node.node_id


def placement(node: NodeInfo) -> Placement:
    return Placement(host_of(node), node.rack, node.zone)


@dataclass(frozen=True)
class TierMap:
    """Configured bandwidth and latency per tier, and the upstream's."""

    tiers: Mapping[Tier, TierLink]
    upstream: TierLink  # bandwidth into one node; latency = first-byte time of one GET
    upstream_streams: int = 4  # GETs one node has in flight at once (cache.fetch_concurrency)
    store_streams: int = 0  # GETs the store serves at once for all nodes (0: no shared limit)

    @classmethod
    def from_config(cls, cfg: ClusterConfig, upstream_streams: int = 4) -> "TierMap":
        tiers = {tier: TierLink(getattr(cfg, f"{name}_gbps") * GBPS, getattr(cfg, f"{name}_latency_us") * 1e-6)
                 for tier, name in ((Tier.SAME_HOST, "same_host"), (Tier.SAME_RACK, "same_rack"),
                                    (Tier.SAME_ZONE, "same_zone"), (Tier.CROSS_ZONE, "cross_zone"))}
        return cls(tiers, TierLink(cfg.upstream_gbps * GBPS, cfg.upstream_first_byte_ms * 1e-3), max(1, upstream_streams),
                   cfg.upstream_store_streams)

    def revalidation_s(self, stale_chunks: int, requests_per_s: float | None = None) -> float:
        """A pin's HEADs of cached chunks not confirmed within ``cache.revalidate_after_s``: at the store's measured
        request rate, else ``upstream_streams`` at once (fewer where the store serves fewer), each the upstream's
        first-byte time. They come before any fetch."""
        if requests_per_s:
            return max(stale_chunks, 0) / requests_per_s
        streams = min(self.upstream_streams, self.store_streams or self.upstream_streams)
        return math.ceil(max(stale_chunks, 0) / max(streams, 1)) * self.upstream.latency_s

    def measured_rate(self, chunk_bytes: float, requests_per_s: float) -> float:
        """Bytes/s of chunk GETs at a measured request rate (each request's first byte, then its bytes at the bandwidth)."""
        bw = self.upstream.bandwidth_bytes_per_s
        return bw if chunk_bytes <= 0 else 1 / (1 / (requests_per_s * chunk_bytes) + 1 / bw)

    def upstream_rate(self, chunk_bytes: float, streams: int = 0) -> float:
        """Bytes/s ``streams`` GETs at once (default: one node's) of ``chunk_bytes``-byte chunks bring: each GET's first
        byte, then its bytes."""
        bw = self.upstream.bandwidth_bytes_per_s
        if chunk_bytes <= 0 or self.upstream.latency_s <= 0:
            return bw
        return 1 / (self.upstream.latency_s / ((streams or self.upstream_streams) * chunk_bytes) + 1 / bw)


@dataclass
class Telemetry:
    """Measured rates per link (bytes/s), each an EWMA over refreshes of the byte and busy-second tallies."""

    alpha: float
    rates: dict[str, float] = field(default_factory=dict)
    seen: dict[str, tuple[float, float]] = field(default_factory=dict)  # link -> (bytes, seconds) at the last refresh

    def refresh(self, totals: Mapping[str, tuple[float, float]]) -> None:
        """Fold what moved since the last refresh (cumulative ``(bytes, busy seconds)`` per link) into each EWMA;
        a link that moved nothing keeps its rate."""
        for link, (nbytes, secs) in totals.items():
            b0, s0 = self.seen.get(link, (0.0, 0.0))
            if secs > s0 and nbytes > b0:
                self.rates[link] = ewma(self.rates.get(link), (nbytes - b0) / (secs - s0), self.alpha)
            self.seen[link] = (nbytes, secs)


@dataclass(frozen=True)
class NodeLoad:
    """What one node knows about its links at one moment."""

    rates: Mapping[str, float] = field(default_factory=dict)  # measured EWMA per link
    flows: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # our in-flight bytes per link
    capacity: Mapping[str, float] = field(default_factory=dict)  # configured bandwidth overrides (the allocator's pool)
    age_s: float = 0.0  # since the rates were refreshed
    startup_s: Mapping[str, float] = field(default_factory=dict)  # learnt fixed costs (FixedCosts.seconds)
    # What this node lands into its cache per second, all fetched shares together (learnt: Estimator.ingest); None: not
    # learnt yet, the links' rates alone.
    ingest_bytes_per_s: float | None = None
    # A pin's own fixed cost until a pin with nothing to fetch has taught it (``startup_s["pin"]``): what the ingest
    # line's fetches cost beside their bytes and one GET's first byte (the same bookkeeping, the GETs left out).
    pin_prior_s: float = 0.0
    # That line's fixed part (the pin's bookkeeping, lookups, a GET's first byte): the start of this node's own upstream
    # share, in place of pin + first byte + the source's residual-learnt cost, which a big fetch's noise would move for
    # every size (the line puts a big fetch's error mostly on its slope). None: not learnt yet.
    fetch_intercept_s: float | None = None


def corrected_startup(previous: float, measured_s: float, predicted_s: float, alpha: float, samples: int = 0) -> float:
    """A fixed cost after one more measurement: moved by the residual (measured minus the prediction, which already
    included ``previous``) times ``max(alpha, 1 / (samples + 1))`` — the mean of the first few, then an EWMA — never
    below 0, so the predictions' bias goes to zero from the first kv-get on."""
    return max(0.0, previous + max(alpha, 1.0 / (samples + 1)) * (measured_s - predicted_s))


def kind_of(source: str) -> str:
    """The kind whose fixed cost a source starts from until it has its own: ``peer`` for ``peer:<W>``, ``upstream`` for
    ``upstream@<W>``, else the source itself."""
    return "peer" if source.startswith("peer:") else "upstream" if source.startswith("upstream@") else source


def fixed_cost(costs: Mapping[str, float], source: str, default: float | None = None) -> float:
    """A source's learnt fixed cost, else ``default``, else its kind's, else any fetch's (``fetch``: the lookup, the grant
    and the set-up every fetched share pays), else 0."""
    if source in costs:
        return costs[source]
    if default is not None:
        return default
    return costs.get(kind_of(source), costs.get("fetch", 0.0))


@dataclass
class FixedCosts:
    """What the links do not explain, learnt from each kv-get's measured split (:func:`corrected_startup`)."""

    alpha: float
    seconds: dict[str, float] = field(default_factory=dict)
    samples: dict[str, int] = field(default_factory=dict)

    def learn(self, key: str, measured_s: float, predicted_s: float, prior: float) -> None:
        """One residual for ``key``, whose value in the prediction was its own or else ``prior``."""
        n = self.samples.get(key, 0)
        self.seconds[key] = corrected_startup(self.seconds.get(key, prior), measured_s, predicted_s, self.alpha, n)
        self.samples[key] = n + 1

    def observe(self, fetch_s: float, first_layer_s: float, predicted_fetch_s: float, predicted_first_layer_s: float,
                critical: str | None = None, used_s: float = 0.0, kind: str | None = None, heads: int = 0, heads_s: float = 0.0) -> None:
        """A finished kv-get: the pin took ``fetch_s`` and its first layer was out ``first_layer_s`` after arrival; the
        prediction said ``predicted_fetch_s`` and ``predicted_first_layer_s``. ``critical``: the fetched source whose end
        set the pin's (None: nothing was fetched), whose fixed cost in the prediction was ``used_s``; ``kind``: the kind it
        also teaches (None: none, e.g. a helper, whose cost is its own). The pin's residual teaches ``pin`` or that
        source, its kind and ``fetch`` (each as if the prediction had used its value: a source or kind not measured yet
        starts from the level above); the rest of the first layer's teaches ``deliver``. A pin with nothing to fetch that
        sent ``heads`` revalidating HEADs (predicted ``heads_s`` of its time) teaches one HEAD's time (``revalidate``)
        instead of ``pin``, so that error scales with the stale count rather than starting every later kv-get."""
        if critical is None and heads > 0:
            self.learn("revalidate", fetch_s / heads, predicted_fetch_s / heads, heads_s / heads)
        elif critical is None:  # the prediction was the pin alone: its learnt value or its prior
            self.learn("pin", fetch_s, predicted_fetch_s, predicted_fetch_s)
        else:
            for level in ("fetch", kind):  # what the prediction would have been with that level's cost
                if level is not None and level != critical:
                    value = fixed_cost(self.seconds, level)
                    self.learn(level, fetch_s, predicted_fetch_s - used_s + value, value)
            self.learn(critical, fetch_s, predicted_fetch_s, used_s)
        self.learn("deliver", first_layer_s - fetch_s, predicted_first_layer_s - predicted_fetch_s, 0.0)


def helper_prior(costs: Mapping[str, float], upstream_s: float | None = None) -> float:
    """A helper's fixed cost until it has its own: the upstream's (its GETs; ``upstream_s``: what this node's fetch line
    puts beyond a pin and a first byte, in place of the residual-learnt ``upstream``) and a peer stream's (here)."""
    return (fixed_cost(costs, "upstream") if upstream_s is None else max(0.0, upstream_s)) + fixed_cost(costs, "peer")


def line_upstream_s(load: NodeLoad, first_byte_s: float) -> float | None:
    """The fetch line's fixed part less the pin and one GET's first byte (what the upstream costs beyond them), or None."""
    if load.fetch_intercept_s is None:
        return None
    return load.fetch_intercept_s - load.startup_s.get("pin", load.pin_prior_s) - first_byte_s


def _link(name: str, tier: Tier, tl: TierLink, load: NodeLoad) -> LinkView:
    return LinkView(name, load.capacity.get(name, tl.bandwidth_bytes_per_s), tl.latency_s, tier,
                    measured_bytes_per_s=load.rates.get(name), flows=load.flows.get(name, ()), age_s=load.age_s)


def build_view(target: NodeInfo, nodes: Mapping[str, NodeInfo], warm: Mapping[str, int], num_chunks: int,
               tiers: TierMap, load: NodeLoad, stale_after_s: float = math.inf, *, chunk_bytes: float = 0.0,
               helpers: Sequence[str] = (), direct: bool = False, gone: Collection[str] = (), relay_batch_chunks: int = 0,
               revalidate_s: float = 0.0) -> OracleView:
    """The sources of a prefix for the engine beside ``target``: its cache, every node in ``warm`` holding a
    leading run (``nodes`` gives their labels; an unknown one is taken as far away), the upstream through it,
    through each of ``helpers``' links (``relay_batch_chunks``: the chunks a helper stores before it streams them),
    and (``direct``) each peer holding all of it straight to the engine.
    A node in ``gone`` (it failed this kv-get) is a source that is not alive. ``revalidate_s``: the pin's HEADs of
    stale cached chunks (:meth:`TierMap.revalidation_s`), before anything else moves."""
    me = target.node_id
    eng = engine_link(me, host_of(target))
    links = {eng: _link(eng, Tier.SAME_HOST, tiers.tiers[Tier.SAME_HOST], load)}
    start = load.startup_s
    pin, deliver = start.get("pin", load.pin_prior_s) + revalidate_s, start.get("deliver", 0.0)

    def to_me(node_id: str) -> str:
        name = peer_link(node_id, me)
        if name not in links:
            other = nodes.get(node_id)
            tier = tier_between(placement(other), placement(target)) if other is not None else Tier.CROSS_ZONE
            links[name] = _link(name, tier, tiers.tiers[tier], load)
        return name

    requests_per_s = load.rates.get(UPSTREAM_REQUESTS)
    # The store as this node's own GETs and HEADs measured it replaces the configured first-byte time on every node's
    # upstream link and on the store's own (the same store; what the others achieve is not known here) — unless the
    # node has learnt its whole fetches' time per byte (the ingest line): the store as its own fetches found it, GETs,
    # landing and all, so the store's links take that rate too (the configured first-byte time and GETs at once are an
    # operator's calibration; what this node's fetches took is the measurement).
    ingest: tuple[str, ...] = ()
    measured_up = tiers.measured_rate(chunk_bytes, requests_per_s) if requests_per_s else None
    if load.ingest_bytes_per_s:
        name = ingest_link(me)
        links[name] = LinkView(name, load.ingest_bytes_per_s, 0.0, Tier.SAME_HOST, age_s=load.age_s)
        ingest, measured_up = (name,), load.ingest_bytes_per_s

    def upstream_into(node_id: str) -> tuple[str, ...]:
        name = upstream_link(node_id)
        if name not in links:
            links[name] = replace(_link(name, UPSTREAM_TIER, TierLink(tiers.upstream_rate(chunk_bytes), 0.0), load),
                                  measured_bytes_per_s=measured_up)
        if not tiers.store_streams:
            return (name,)
        if STORE_LINK not in links:
            links[STORE_LINK] = replace(_link(STORE_LINK, UPSTREAM_TIER, TierLink(tiers.upstream_rate(chunk_bytes, tiers.store_streams), 0.0), load),
                                        measured_bytes_per_s=measured_up)
        return (STORE_LINK, name)  # every node's GETs share the store

    sources = [Source("local", SourceKind.LOCAL, min(warm.get(me, 0), num_chunks), (eng,), startup_s=pin + deliver)]
    for node_id, chunks in sorted(warm.items()):
        if node_id == me or chunks <= 0:
            continue
        name = f"peer:{node_id}"
        sources.append(Source(name, SourceKind.PEER, min(chunks, num_chunks), (to_me(node_id), *ingest, eng), alive=node_id not in gone,
                              startup_s=pin + fixed_cost(start, name), store_and_forward=True, deliver_s=deliver))
        other = nodes.get(node_id)
        if direct and chunks >= num_chunks and other is not None:
            link = engine_link(node_id, host_of(target))
            tier = tier_between(placement(other), placement(target))
            links[link] = _link(link, tier, tiers.tiers[tier], load)
            # The peer's own kv-get to the engine: a peer's fixed cost, then its delivery's.
            sources.append(Source(f"direct:{node_id}", SourceKind.PEER, num_chunks, (link,), alive=node_id not in gone,
                                  startup_s=fixed_cost(start, "peer") + deliver, whole_only=True))
    first_byte = tiers.upstream.latency_s
    own_start = pin + first_byte + fixed_cost(start, f"upstream@{me}") if load.fetch_intercept_s is None else revalidate_s + load.fetch_intercept_s
    sources.append(Source(f"upstream@{me}", SourceKind.UPSTREAM, num_chunks, (*upstream_into(me), *ingest, eng),
                          startup_s=own_start, store_and_forward=True, deliver_s=deliver))
    for node_id in sorted(set(helpers) - {me}):
        # A helper's share: its GETs into its cache, then a peer stream here (until measured: the upstream's fixed cost
        # and a peer stream's), a fill batch at a time.
        ups = upstream_into(node_id)
        name = f"upstream@{node_id}"
        sources.append(Source(name, SourceKind.UPSTREAM, num_chunks, (*ups, to_me(node_id), *ingest, eng), alive=node_id not in gone,
                              startup_s=pin + first_byte + fixed_cost(start, name, helper_prior(start, line_upstream_s(load, first_byte))),
                              store_and_forward=True,
                              deliver_s=deliver, relay_at=len(ups), relay_batch_chunks=relay_batch_chunks))
    return OracleView(tuple(sources), links, stale_after_s)


def taken_plan(me: str, paths: Mapping[str, int], num_chunks: int,
               moves: Sequence[tuple[str, int]] | None = None) -> tuple[dict[str, int], list[tuple[str, int, int]], list[str]]:
    """What a finished pin did, for the oracle to predict: warm counts, a plan in prefix order (this node's cache
    first) and the helpers it used. ``moves``: the fetcher's record, ``(source, chunks)`` per share it fetched
    (``peer:<W>``, ``upstream@<W>``); without it, the pin's bytes per path (``local``, ``peer:<W>``, ``upstream``)
    shared out in proportion (a compressed chunk has fewer bytes than a raw one; the proportions hold)."""
    if moves is None:
        total = sum(n for n in paths.values() if n > 0) or 1
        order = sorted(p for p in paths if p.startswith("peer:")) + (["upstream"] if paths.get("upstream") else [])
        moves = [(f"upstream@{me}" if p == "upstream" else p, round(num_chunks * paths[p] / total)) for p in order]
    local = max(0, num_chunks - sum(c for _, c in moves))
    warm: dict[str, int] = {me: local} if local else {}
    plan: list[tuple[str, int, int]] = [("local", 0, local)] if local else []
    helpers: list[str] = []
    at = local
    for source, count in moves:
        count = min(count, num_chunks - at)
        if count <= 0:
            continue
        if source.startswith("peer:"):
            warm[source.removeprefix("peer:")] = num_chunks
        elif (node := source.removeprefix("upstream@")) != me:
            helpers.append(node)
        plan.append((source, at, at + count))
        at += count
    if at < num_chunks:  # whatever the record missed came from this node's own GETs
        plan.append((f"upstream@{me}", at, num_chunks))
    return warm, plan, helpers
