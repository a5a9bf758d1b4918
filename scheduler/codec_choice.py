"""When compression pays: the break-even model that picks a codec for one transfer (pure, no I/O, no clocks).

A layerwise load is a three-stage pipeline over its ``L`` layers: the link carries layer ℓ's
wire bytes, the decode workers turn them back into raw bytes, the engine computes on layer ℓ.
With ``s`` raw bytes per layer, compression ratio ``k``, link rate ``r``, decode throughput
``D`` (raw bytes out per second per core) on ``w`` workers and compute window ``c``:

* link time per layer ``x = s / (k·r)``; decode time per layer ``d = s / (D·w)`` (0 for raw);
* layer ℓ arrives at ``a_ℓ = ℓ·x``, is ready at ``R_ℓ = max(a_ℓ, R_ℓ₋₁) + d`` and computed by
  ``E_ℓ = max(R_ℓ, E_ℓ₋₁) + c``; the request's stall is ``E_L − L·c`` (with ``c = 0``: the load time).

The chooser evaluates every allowed codec and raw under this model and takes the smallest stall,
so by construction it is never worse (in the model) than any fixed choice. In steady state a codec
with ``k > 1`` beats raw exactly when ``r < D·w`` (:func:`break_even_rate`): compression pays on
links slower than the decoders, and raw wins on fast ones — ShadowServe's observation (§2, §6).

```python
from scheduler.codec_choice import CodecProfile, CodecRequest, choose_codec
choice = choose_codec(CodecRequest(link_bytes_per_s=rate, payload_bytes=n, num_layers=32, decode_workers=4,
                                   allow_lossy=namespace_allows_lossy), profiles)
choice.codec  # "none" or a profile's name
```

The node calls :func:`choose_codec` when it plans a transfer whose chunks it can send either way
(stored compressed: decode in the node and send raw, or ship compressed for the SDK to decode), with
the request's allocated or measured link rate and the codec profiles it measured at start-up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

RAW = "none"


@dataclass(frozen=True)
class CodecProfile:
    """A codec's measured figures: ``ratio`` raw/compressed bytes, decode throughput in raw bytes out per
    second on one core (``inf`` for raw), and whether it loses precision."""

    name: str
    ratio: float
    decode_bytes_per_s_per_core: float
    lossy: bool = False

    @property
    def usable(self) -> bool:
        """Known, positive figures (an unmeasured codec is never chosen)."""
        return (self.ratio > 0 and math.isfinite(self.ratio)
                and self.decode_bytes_per_s_per_core > 0 and not math.isnan(self.decode_bytes_per_s_per_core))


RAW_PROFILE = CodecProfile(RAW, 1.0, math.inf, lossy=False)


def check_transfer(num_layers: int, payload_bytes: float, compute_per_layer_s: float) -> None:
    """What every transfer these models take must be: at least one layer, a finite payload and compute window."""
    if num_layers < 1:
        raise ValueError(f"num_layers must be at least 1, not {num_layers}")
    if not (payload_bytes >= 0 and math.isfinite(payload_bytes)):
        raise ValueError(f"payload_bytes must be finite and >= 0, not {payload_bytes}")
    if not (compute_per_layer_s >= 0 and math.isfinite(compute_per_layer_s)):
        raise ValueError(f"compute_per_layer_s must be finite and >= 0, not {compute_per_layer_s}")


@dataclass(frozen=True)
class CodecRequest:
    """One transfer: its rate on its link (bytes/s; ``None``/0/NaN when not known yet), raw payload bytes,
    layers, decode workers available to it, whether its namespace allows lossy codecs, and its per-layer
    compute window (0: stall = load time)."""

    link_bytes_per_s: float | None
    payload_bytes: float
    num_layers: int
    decode_workers: int
    allow_lossy: bool = False
    compute_per_layer_s: float = 0.0

    def __post_init__(self) -> None:
        check_transfer(self.num_layers, self.payload_bytes, self.compute_per_layer_s)
        if self.decode_workers < 0:
            raise ValueError(f"decode_workers must be >= 0, not {self.decode_workers}")

    @property
    def rate_known(self) -> bool:
        r = self.link_bytes_per_s
        return r is not None and r > 0 and not math.isnan(r)


@dataclass(frozen=True)
class CodecChoice:
    """The codec to use, its modelled stall, raw's, every candidate's (name, stall) and why."""

    codec: str
    stall_s: float
    raw_stall_s: float
    stalls: tuple[tuple[str, float], ...]
    reason: str

    @property
    def modelled_speedup(self) -> float:
        """Raw's stall over the chosen codec's (1 when both are 0)."""
        if self.stall_s == 0:
            return 1.0 if self.raw_stall_s == 0 else math.inf
        return self.raw_stall_s / self.stall_s


def modelled_stall(profile: CodecProfile, req: CodecRequest) -> float:
    """The request's stall (seconds) with ``profile``, under the pipeline model above; needs a known rate."""
    if not req.rate_known:
        raise ValueError("modelled_stall needs a known link rate")
    if req.payload_bytes == 0:
        return 0.0
    per_layer = req.payload_bytes / req.num_layers
    x = per_layer / profile.ratio / req.link_bytes_per_s  # type: ignore[operator]
    if profile.name == RAW or math.isinf(profile.decode_bytes_per_s_per_core):
        d = 0.0
    elif req.decode_workers == 0:
        return math.inf
    else:
        d = per_layer / (profile.decode_bytes_per_s_per_core * req.decode_workers)
    return pipeline_stall([x, d], req.num_layers, req.compute_per_layer_s)


def pipeline_stall(stages: Sequence[float], num_layers: int, compute_per_layer_s: float = 0.0) -> float:
    """The engine's stall when every layer passes ``stages`` (seconds per layer each, in order) and then its
    compute: a tandem pipeline, ``F_j(ℓ) = max(F_j₋₁(ℓ), F_j(ℓ−1)) + t_j``; stall = ``F_compute(L) − L·c``."""
    times = [*stages, compute_per_layer_s]
    finish = [0.0] * len(times)
    for _ in range(num_layers):
        upstream = 0.0
        for j, t in enumerate(times):
            finish[j] = max(upstream, finish[j]) + t
            upstream = finish[j]
    return max(0.0, finish[-1] - num_layers * compute_per_layer_s)


def _preference(p: CodecProfile) -> tuple[int, int, float, str]:
    """Tie order: raw, then lossless, then the smaller wire (higher ratio), then the name."""
    return (0 if p.name == RAW else 1, 1 if p.lossy else 0, -p.ratio, p.name)


def choose_codec(req: CodecRequest, profiles: Sequence[CodecProfile], rel_tie: float = 1e-9) -> CodecChoice:
    """The allowed codec (raw always among them) with the smallest modelled stall; ties go to raw, then lossless.

    Raw without a model when the rate is unknown (no basis to spend decode work), the payload is empty or there
    are no decode workers. Lossy codecs only when ``req.allow_lossy``; unmeasured ones never.
    """
    names = [p.name for p in profiles]
    if dup := next((n for n in names if names.count(n) > 1), None):
        raise ValueError(f"profiles: codec {dup!r} named twice")
    candidates = [RAW_PROFILE] + [p for p in profiles if p.name != RAW and p.usable and (req.allow_lossy or not p.lossy)]
    if not req.rate_known:
        return CodecChoice(RAW, math.nan, math.nan, (), "link rate unknown: raw")
    if req.payload_bytes == 0:
        return CodecChoice(RAW, 0.0, 0.0, ((RAW, 0.0),), "empty payload: raw")
    if req.decode_workers == 0:
        candidates = [RAW_PROFILE]
    stalls = [(p, modelled_stall(p, req)) for p in candidates]
    best = min(s for _, s in stalls)
    tied = [p for p, s in stalls if s <= best * (1 + rel_tie)]
    pick = min(tied, key=_preference)
    raw = stalls[0][1]
    pick_stall = next(s for p, s in stalls if p is pick)
    if pick.name == RAW:
        reason = "no decode workers: raw" if req.decode_workers == 0 else "raw is fastest (link faster than decode, or no codec gains)"
    else:
        reason = f"{pick.name}: modelled stall {pick_stall:.4g}s vs raw {raw:.4g}s"
    return CodecChoice(pick.name, pick_stall, raw, tuple((p.name, s) for p, s in stalls), reason)


def break_even_rate(profile: CodecProfile, decode_workers: int) -> float:
    """The steady-state link rate (bytes/s) below which ``profile`` beats raw: ``D·w`` when it compresses, else 0."""
    if profile.name == RAW or not profile.usable or profile.ratio <= 1 or decode_workers <= 0:
        return 0.0
    return profile.decode_bytes_per_s_per_core * decode_workers


def decode_while_fetching(arrival_bytes_per_s: float | None, ratio: float, decode_bytes_per_s: float | None) -> bool:
    """Whether chunks fetched compressed at ``arrival_bytes_per_s`` (encoded bytes/s from the upstream, all fetches
    together) should be decoded as they stream in, by workers that together decode ``decode_bytes_per_s`` raw bytes/s:
    yes when they keep up with the raw-equivalent arrival rate (``arrival · ratio``), so the decode hides behind the
    link; no when they cannot (then the fetch finishes first and the node's whole staged pipeline decodes after it,
    sooner). Measured on a 2-core VM over SeaweedFS (A/B interleaved): zstd at a 50 MB/s upstream 1.42x faster
    streaming (arrival·ratio 0.07 GB/s vs decode 0.4), int4+zstd unpaced 0.63x (0.73 GB/s vs 0.15). An unknown figure:
    yes (the first streamed chunks measure the decoders)."""
    if arrival_bytes_per_s is None or not arrival_bytes_per_s > 0 or math.isnan(arrival_bytes_per_s):
        return True
    if decode_bytes_per_s is None or not decode_bytes_per_s > 0 or math.isnan(decode_bytes_per_s):
        return True
    return arrival_bytes_per_s * max(ratio, 1.0) <= decode_bytes_per_s
