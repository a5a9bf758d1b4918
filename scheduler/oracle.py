"""The delivery-time oracle's cost model: pure functions of numbers (no I/O, no clocks).

How long until ``n`` bytes have crossed a link that others are using too? Each
link is a :class:`LinkView`, the record a node fills in from its config and
measurements:

* a **static tier map** from topology labels (:func:`tier_between`: same host,
  rack, zone or across zones) gives each link its configured bandwidth and
  latency (:class:`TierLink`, NetKV's ``tier_bandwidth``/``tier_latency``);
* **measured rates** correct the configured bandwidth (:func:`ewma` of achieved
  per-peer throughput);
* **dynamic congestion**: ``background`` is the fraction of the link used by
  traffic that is not ours (telemetry), ``reserved_bytes_per_s`` what the
  bandwidth allocator has promised to loads not listed as flows, and ``flows``
  the remaining bytes of our own in-flight transfers (self-contention: always
  fresh, the node started them).

Telemetry older than ``stale_after_s`` is not trusted: the link falls back to
its configured bandwidth with no background (the static map alone), which is
what NetKV found carries most of the gain, while our own flows still count.

A link shares its capacity max-min fairly among its flows (what TCP and the
simulator's fabric do), i.e. processor sharing: a new transfer of ``n`` bytes
among flows with ``q_i`` bytes left has received ``x`` bytes after
``(x + Σ min(q_i, x)) / C`` seconds (:func:`ps_seconds`), exact when nothing
else arrives meanwhile.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, replace
from enum import IntEnum
from functools import cached_property

# Below this fraction of its bandwidth a link is treated as nearly full, not as having none:
# a prediction must stay finite, and a congested link still drains.
MIN_FREE_FRACTION = 0.02


class Tier(IntEnum):
    """How far apart two places are; a lower tier is a shorter, usually faster path."""

    SAME_HOST = 0
    SAME_RACK = 1
    SAME_ZONE = 2
    CROSS_ZONE = 3


@dataclass(frozen=True)
class Placement:
    """Topology labels of a node or engine (e.g. Kubernetes ``topology.kubernetes.io/zone`` and a rack label)."""

    host: str
    rack: str = ""
    zone: str = ""


def tier_between(a: Placement, b: Placement) -> Tier:
    """The tier of the path between two placements.

    Unknown labels are taken as far apart (a missing rack or zone never matches), so a
    mislabelled node is under- rather than over-rated.
    """
    if a.host == b.host:
        return Tier.SAME_HOST
    if a.zone and b.zone and a.zone != b.zone:
        return Tier.CROSS_ZONE
    if a.rack and a.rack == b.rack and a.zone == b.zone:
        return Tier.SAME_RACK
    if a.zone and a.zone == b.zone:
        return Tier.SAME_ZONE
    return Tier.CROSS_ZONE


@dataclass(frozen=True)
class TierLink:
    """Configured bandwidth (bytes/s) and one-way latency (s) of one tier."""

    bandwidth_bytes_per_s: float
    latency_s: float

    def __post_init__(self) -> None:
        if not (self.bandwidth_bytes_per_s > 0 and math.isfinite(self.bandwidth_bytes_per_s)):
            raise ValueError(f"bandwidth_bytes_per_s must be positive and finite, not {self.bandwidth_bytes_per_s}")
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise ValueError(f"latency_s must be finite and >= 0, not {self.latency_s}")


GBPS = 1e9 / 8
# Defaults in the ranges NetKV quotes (same host: NVLink/PCIe or memory; rack: ToR RoCE;
# zone: one aggregation hop at 2:1; cross-zone: the core at 4:1).
DEFAULT_TIERS: dict[Tier, TierLink] = {
    Tier.SAME_HOST: TierLink(200 * GBPS, 2e-6),
    Tier.SAME_RACK: TierLink(100 * GBPS, 5e-6),
    Tier.SAME_ZONE: TierLink(50 * GBPS, 10e-6),
    Tier.CROSS_ZONE: TierLink(25 * GBPS, 25e-6),
}


def ewma(previous: float | None, sample: float, alpha: float) -> float:
    """Exponentially weighted moving average; the first sample is taken as is."""
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], not {alpha}")
    if not (sample >= 0 and math.isfinite(sample)):
        raise ValueError(f"a measured rate must be finite and >= 0, not {sample}")
    return sample if previous is None else alpha * sample + (1 - alpha) * previous


@dataclass(frozen=True)
class LinkView:
    """What the oracle knows about one link (the record a node fills in per peer, upstream or engine link)."""

    name: str
    capacity_bytes_per_s: float  # configured: the tier's bandwidth
    latency_s: float = 0.0
    tier: Tier = Tier.SAME_RACK
    measured_bytes_per_s: float | None = None  # EWMA of achieved throughput; replaces the configured one when fresh
    background: float = 0.0  # fraction of the link used by traffic that is not ours
    reserved_bytes_per_s: float = 0.0  # the allocator's promises to loads not listed in flows
    flows: tuple[float, ...] = ()  # remaining bytes of our in-flight transfers here
    age_s: float = 0.0  # seconds since measured/background were refreshed

    def __post_init__(self) -> None:
        if not (self.capacity_bytes_per_s > 0 and math.isfinite(self.capacity_bytes_per_s)):
            raise ValueError(f"link {self.name!r}: capacity must be positive and finite")
        if not 0 <= self.background <= 1:
            raise ValueError(f"link {self.name!r}: background must be a fraction, not {self.background}")
        if self.reserved_bytes_per_s < 0 or any(q < 0 for q in self.flows):
            raise ValueError(f"link {self.name!r}: reservations and flows must be >= 0")

    def effective_bytes_per_s(self, stale_after_s: float = math.inf) -> float:
        """Capacity left to our flows: (measured or configured) × (1 − background) − reserved, floored."""
        memo = self.__dict__.setdefault("_effective_memo", {})
        if stale_after_s not in memo:
            memo[stale_after_s] = self._effective(stale_after_s)
        return memo[stale_after_s]

    def _effective(self, stale_after_s: float) -> float:
        fresh = self.age_s <= stale_after_s
        base = self.measured_bytes_per_s if fresh and self.measured_bytes_per_s else self.capacity_bytes_per_s
        background = self.background if fresh else 0.0
        return max(base * (1 - background) - self.reserved_bytes_per_s, base * MIN_FREE_FRACTION)

    @cached_property
    def _sorted_flows(self) -> tuple[list[float], list[float]]:
        flows = sorted(self.flows)
        return flows, list(itertools.accumulate(flows, initial=0.0))

    def ahead_of(self, nbytes: float) -> float:
        """``Σ min(q_i, nbytes)``: what the flows here take from the link while a new one receives ``nbytes``."""
        flows, prefix = self._sorted_flows
        k = bisect.bisect_left(flows, nbytes)
        return prefix[k] + nbytes * (len(flows) - k)

    @property
    def queued_bytes(self) -> float:
        return self._sorted_flows[1][-1]

    def with_flow(self, nbytes: float) -> "LinkView":
        return replace(self, flows=(*self.flows, float(nbytes))) if nbytes > 0 else self


def ps_seconds(link: LinkView, nbytes: float, stale_after_s: float = math.inf, others: float = 0.0) -> float:
    """Seconds until a new transfer has received ``nbytes`` on ``link`` under fair sharing.

    ``others``: bytes of the same request's other segments on this link (they share it too).
    """
    if nbytes <= 0:
        return 0.0
    ahead = link.ahead_of(nbytes) + min(others, nbytes)
    return (nbytes + ahead) / link.effective_bytes_per_s(stale_after_s)


def fair_share(link: LinkView, stale_after_s: float = math.inf, extra_flows: int = 1) -> float:
    """A new flow's instantaneous rate on the link: its equal part of what is free."""
    return link.effective_bytes_per_s(stale_after_s) / (len(link.flows) + extra_flows)


@dataclass(frozen=True)
class DeliveryEstimate:
    """The oracle's answer for one path: when the first layer and the whole payload have arrived."""

    first_layer_s: float
    total_s: float
    rate_bytes_per_s: float  # the transfer's instantaneous share of its bottleneck
    queued_bytes: float  # our in-flight bytes on its links
    tier: Tier  # the farthest tier the path crosses


def estimate_path(links: list[LinkView], payload_bytes: float, num_layers: int, startup_s: float = 0.0,
                  stale_after_s: float = math.inf) -> DeliveryEstimate:
    """Time to the first layer and to the whole payload over ``links`` (a pipelined path: the slowest link sets the pace)."""
    if num_layers < 1:
        raise ValueError("num_layers must be at least 1")
    if not links:
        return DeliveryEstimate(startup_s, startup_s, math.inf, 0.0, Tier.SAME_HOST)
    latency = startup_s + sum(link.latency_s for link in links)
    total = latency + max(ps_seconds(link, payload_bytes, stale_after_s) for link in links)
    first = latency + max(ps_seconds(link, payload_bytes / num_layers, stale_after_s) for link in links)
    rate = min(fair_share(link, stale_after_s) for link in links)
    return DeliveryEstimate(first, total, rate, sum(link.queued_bytes for link in links), max(link.tier for link in links))


def modelled_ttft(first_layer_s: float, total_s: float, num_layers: int, compute_per_layer_s: float) -> float:
    """TTFT of a layerwise load with one-layer prefetch when layers land evenly between the first and the last.

    Layer ℓ lands at ``f + ℓ·d`` (``d = (T − f)/(L − 1)``); computing it starts when it has
    landed and layer ℓ−1 is done, so TTFT = ``f + (L − 1)·max(d, c) + c``.
    """
    if num_layers <= 1:
        return total_s + compute_per_layer_s
    gap = max(total_s - first_layer_s, 0.0) / (num_layers - 1)
    return first_layer_s + (num_layers - 1) * max(gap, compute_per_layer_s) + compute_per_layer_s


@dataclass(frozen=True)
class EngineClock:
    """When a continuously batching engine can start a request: new requests join at iteration boundaries.

    ``step_s``: one iteration with this request in the batch; ``phase_s``: when its current run of iterations
    began, on the caller's clock (None: idle, it starts a request at once); ``free_at_s``: when a slot is free
    for it (the queue ahead), on the same clock."""

    step_s: float
    phase_s: float | None = None
    free_at_s: float = 0.0


def first_token_at(engine: EngineClock, ready_at_s: float, now_s: float) -> float:
    """When the request's first token is out if its KV is in the engine's memory at ``ready_at_s``: it joins the
    batch at the first boundary after it is ready and a slot is free, and its token comes one iteration later.

    Only the boundaries of the iteration running now are known (later ones move as requests join and leave and
    the step changes with the batch): a request ready later than one step from ``now_s`` waits half a step, the mean."""
    t = max(ready_at_s, engine.free_at_s)
    if engine.phase_s is None or engine.step_s <= 0:
        return t + engine.step_s
    if t - now_s > engine.step_s:
        return t + 1.5 * engine.step_s
    wait = engine.step_s - ((t - engine.phase_s) % engine.step_s)
    return t + wait + engine.step_s


@dataclass
class LineFit:
    """``y ≈ intercept + slope·x`` learnt online: least squares over the samples, each weighted as the
    learnt fixed costs weigh theirs (the mean of the first few, then an EWMA of weight ``alpha``),
    plus one prior point ``(0, prior_y)`` of weight ``prior_weight`` passed at each reading.

    Why a line and not a rate and a fixed cost learnt apart: a rate that is off by a factor leaves a residual
    that grows with the size, and a fixed cost fed that residual is right only for the sizes it was fed. The
    prior point (what a fetch of nothing costs: a GET's first byte) pins the line while every sample has one
    size, so the first small request after many large ones is not charged their per-byte time as a fixed cost."""

    alpha: float
    prior_weight: float = 0.5
    samples: int = 0
    sums: tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0)  # Σw, Σwx, Σwy, Σwx², Σwxy

    def add(self, x: float, y: float) -> None:
        if not (x >= 0 and math.isfinite(x) and math.isfinite(y)):
            raise ValueError(f"a sample must be finite with x >= 0, not ({x}, {y})")
        keep = 1 - max(self.alpha, 1.0 / (self.samples + 1))
        w, sx, sy, sxx, sxy = (s * keep for s in self.sums)
        self.sums = (w + 1, sx + x, sy + y, sxx + x * x, sxy + x * y)
        self.samples += 1

    def line(self, prior_y: float) -> tuple[float, float] | None:
        """``(intercept, slope)``, or None with no sample yet or no positive slope (nothing to say per unit of x)."""
        if not self.samples:
            return None
        w, sx, sy, sxx, sxy = self.sums
        w, sy = w + self.prior_weight, sy + self.prior_weight * prior_y
        det = w * sxx - sx * sx
        if det <= 1e-12 * max(w * sxx, 1e-300):
            return None
        slope = (w * sxy - sx * sy) / det
        if not slope > 0:
            return None
        return (sy - slope * sx) / w, slope
