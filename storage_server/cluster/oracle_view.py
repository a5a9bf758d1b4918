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
pin precedes the transfer), so peer and upstream sources are ``store_and_forward``: their first
layer is predicted when their last chunk has landed, not one layer's bytes after the start.

Each link's bandwidth and latency come from the static tier map (``[cluster]`` config); a link this
node measures (its peers' streams into it, its own deliveries to its engines) has the EWMA of its
achieved rate (:class:`Telemetry`), which replaces the configured bandwidth while fresh; the
node's in-flight bytes on a link are its flows (self-contention). What the links do not explain — the
fixed cost of a request (lookups, connections, the gateway, the first read) — is learnt per kind of
source from the node's own kv-gets (:func:`corrected_startup`) and starts each source of that kind.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from protocol.cluster import NodeInfo
from protocol.config import ClusterConfig
from scheduler.oracle import GBPS, LinkView, Placement, Tier, TierLink, ewma, tier_between
from scheduler.paths import OracleView, Source, SourceKind

UPSTREAM_TIER = Tier.CROSS_ZONE  # the upstream is reported as the farthest tier
STORE_LINK = "upstream"  # the store itself, when its GETs at once for all nodes are limited (cluster.upstream_store_streams)


def engine_link(node_id: str, host: str) -> str:
    return f"{node_id}->{host}"


def peer_link(source: str, node_id: str) -> str:
    return f"{source}->{node_id}"


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
    startup_s: Mapping[str, float] = field(default_factory=dict)  # learnt fixed cost per source kind: local, peer, upstream


def corrected_startup(previous: float, measured_s: float, predicted_s: float, alpha: float) -> float:
    """A source kind's fixed cost after one kv-get: moved by ``alpha`` of the first layer's residual (measured minus the
    prediction, which already included ``previous``), never below 0, so the predictions' bias goes to zero."""
    return max(0.0, previous + alpha * (measured_s - predicted_s))


def kind_of(paths: Mapping[str, int]) -> str:
    """The farthest kind of source a finished kv-get used (the one whose fixed cost it measured)."""
    if paths.get("upstream"):
        return "upstream"
    return "peer" if any(p.startswith("peer:") and n for p, n in paths.items()) else "local"


def _link(name: str, tier: Tier, tl: TierLink, load: NodeLoad) -> LinkView:
    return LinkView(name, load.capacity.get(name, tl.bandwidth_bytes_per_s), tl.latency_s, tier,
                    measured_bytes_per_s=load.rates.get(name), flows=load.flows.get(name, ()), age_s=load.age_s)


def build_view(target: NodeInfo, nodes: Mapping[str, NodeInfo], warm: Mapping[str, int], num_chunks: int,
               tiers: TierMap, load: NodeLoad, stale_after_s: float = math.inf, *, chunk_bytes: float = 0.0,
               helpers: Sequence[str] = (), direct: bool = False, gone: Collection[str] = ()) -> OracleView:
    """The sources of a prefix for the engine beside ``target``: its cache, every node in ``warm`` holding a
    leading run (``nodes`` gives their labels; an unknown one is taken as far away), the upstream through it,
    through each of ``helpers``' links, and (``direct``) each peer holding all of it straight to the engine.
    A node in ``gone`` (it failed this kv-get) is a source that is not alive."""
    me = target.node_id
    eng = engine_link(me, host_of(target))
    links = {eng: _link(eng, Tier.SAME_HOST, tiers.tiers[Tier.SAME_HOST], load)}
    start = load.startup_s

    def to_me(node_id: str) -> str:
        name = peer_link(node_id, me)
        if name not in links:
            other = nodes.get(node_id)
            tier = tier_between(placement(other), placement(target)) if other is not None else Tier.CROSS_ZONE
            links[name] = _link(name, tier, tiers.tiers[tier], load)
        return name

    def upstream_into(node_id: str) -> tuple[str, ...]:
        name = upstream_link(node_id)
        links.setdefault(name, _link(name, UPSTREAM_TIER, TierLink(tiers.upstream_rate(chunk_bytes), 0.0), load))
        if not tiers.store_streams:
            return (name,)
        links.setdefault(STORE_LINK, _link(STORE_LINK, UPSTREAM_TIER, TierLink(tiers.upstream_rate(chunk_bytes, tiers.store_streams), 0.0), load))
        return (STORE_LINK, name)  # every node's GETs share the store

    sources = [Source("local", SourceKind.LOCAL, min(warm.get(me, 0), num_chunks), (eng,), startup_s=start.get("local", 0.0))]
    for node_id, chunks in sorted(warm.items()):
        if node_id == me or chunks <= 0:
            continue
        sources.append(Source(f"peer:{node_id}", SourceKind.PEER, min(chunks, num_chunks), (to_me(node_id), eng),
                              alive=node_id not in gone, startup_s=start.get("peer", 0.0), store_and_forward=True))
        other = nodes.get(node_id)
        if direct and chunks >= num_chunks and other is not None:
            name = engine_link(node_id, host_of(target))
            tier = tier_between(placement(other), placement(target))
            links[name] = _link(name, tier, tiers.tiers[tier], load)
            sources.append(Source(f"direct:{node_id}", SourceKind.PEER, num_chunks, (name,), alive=node_id not in gone,
                                  startup_s=start.get("peer", 0.0), whole_only=True))
    up_start = tiers.upstream.latency_s + start.get("upstream", 0.0)
    sources.append(Source(f"upstream@{me}", SourceKind.UPSTREAM, num_chunks, (*upstream_into(me), eng), startup_s=up_start,
                          store_and_forward=True))
    for node_id in sorted(set(helpers) - {me}):
        # A helper's share pays the upstream's fixed cost and then a peer stream's (grant, connection, its first chunk).
        sources.append(Source(f"upstream@{node_id}", SourceKind.UPSTREAM, num_chunks, (*upstream_into(node_id), to_me(node_id), eng),
                              alive=node_id not in gone, startup_s=up_start + start.get("peer", 0.0), store_and_forward=True))
    return OracleView(tuple(sources), links, stale_after_s)


def taken_plan(me: str, paths: Mapping[str, int], chunk_bytes: int, num_chunks: int) -> tuple[dict[str, int], list[tuple[str, int, int]]]:
    """A finished pin's bytes per path (``local``, ``peer:<W>``, ``upstream``) as warm counts and a plan in prefix
    order (local first, then peers by name, then the upstream): what the node did, for the oracle to predict."""
    warm: dict[str, int] = {}
    plan: list[tuple[str, int, int]] = []
    at = 0
    order = ["local", *sorted(p for p in paths if p.startswith("peer:")), "upstream"]
    for path in order:
        count = min(paths.get(path, 0) // max(chunk_bytes, 1), num_chunks - at)
        if path == "upstream":
            count = num_chunks - at  # whatever was not counted elsewhere came from the upstream
        if count <= 0:
            continue
        node = me if path == "local" else path.removeprefix("peer:")
        if path != "upstream":
            warm[node] = count
        plan.append(("local" if path == "local" else f"upstream@{me}" if path == "upstream" else path, at, at + count))
        at += count
    return warm, plan
