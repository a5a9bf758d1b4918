"""Bandwidth allocation policies: pure functions of numbers (no I/O, no clocks).

Request i moves ``s_i`` bytes per layer and has a per-layer compute window
``c_i``; at rate ``r_i`` its per-layer stall is ``max(0, s_i/r_i − c_i)`` and
its zero-stall rate is ``r_i* = s_i / c_i``.

* ``stall-opt`` minimises ``Σ s_i / r_i`` subject to ``Σ r_i = B`` and
  ``0 < r_i ≤ r_i*``. The KKT conditions give water-filling:
  ``r_i = min(r_i*, λ·√s_i)`` with λ chosen so the rates sum to B (every
  request gets ``r_i*`` when ``Σ r_i* ≤ B``).
* ``calibrated-stall-opt``: the same with targets ``r_i* + margin``.
* Baselines: ``equal`` (B/n), ``kv-prop`` (∝ total KV bytes ``s_i·L_i``),
  ``bw-prop`` (∝ ``r_i*``).

Weights (per request, e.g. from a tenant) scale the objective: stall-opt
minimises ``Σ w_i s_i / r_i``, so ``r_i = min(t_i, λ·√(w_i s_i))``; the
proportional baselines multiply their shares by ``w_i``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

POLICIES = ("equal", "kv-prop", "bw-prop", "stall-opt", "calibrated-stall-opt")


@dataclass(frozen=True)
class TransferDemand:
    """One layerwise load: bytes per layer, compute per layer (seconds), number of layers."""

    bytes_per_layer: float
    compute_per_layer_s: float
    num_layers: int = 1
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not (self.bytes_per_layer >= 0 and math.isfinite(self.bytes_per_layer)):
            raise ValueError(f"bytes_per_layer must be finite and >= 0, not {self.bytes_per_layer}")
        if not (self.compute_per_layer_s >= 0 and math.isfinite(self.compute_per_layer_s)):
            raise ValueError(f"compute_per_layer_s must be finite and >= 0, not {self.compute_per_layer_s}")
        if self.num_layers < 1:
            raise ValueError("num_layers must be at least 1")
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise ValueError("weight must be positive")

    @property
    def zero_stall_rate(self) -> float:
        """``s / c`` (infinite when there is no compute to hide behind)."""
        if self.bytes_per_layer == 0:
            return 0.0
        return math.inf if self.compute_per_layer_s == 0 else self.bytes_per_layer / self.compute_per_layer_s


def water_fill(sizes: np.ndarray, targets: np.ndarray, capacity: float) -> np.ndarray:
    """``r_i = min(t_i, λ·√s_i)`` with ``Σ r_i = capacity`` (or ``r = t`` when ``Σ t ≤ capacity``).

    Sort by the breakpoint ``t_i/√s_i``; with the k smallest capped at their
    targets, ``λ = (B − Σ_capped t) / Σ_uncapped √s``; the right k is the first
    whose λ does not exceed the next breakpoint. O(n log n), vectorised.
    """
    n = len(sizes)
    if n == 0:
        return np.zeros(0)
    if np.sum(targets) <= capacity:
        return targets.astype(float).copy()
    root = np.sqrt(sizes)
    with np.errstate(divide="ignore", invalid="ignore"):
        breakpoints = np.where(root > 0, targets / root, np.inf)
    order = np.argsort(breakpoints, kind="stable")
    t_sorted, root_sorted, bp_sorted = targets[order], root[order], breakpoints[order]
    capped_sum = np.concatenate(([0.0], np.cumsum(np.where(np.isfinite(t_sorted), t_sorted, 0.0))))[:-1]
    free_root = np.cumsum(root_sorted[::-1])[::-1]  # Σ √s over positions ≥ k
    with np.errstate(divide="ignore", invalid="ignore"):
        lam = (capacity - capped_sum) / free_root
    # k = number capped; valid when λ_k ≤ breakpoint_k (position k is not capped).
    valid = lam <= bp_sorted
    k = int(np.argmax(valid)) if valid.any() else n - 1
    rates_sorted = np.minimum(t_sorted, lam[k] * root_sorted)
    rates_sorted[:k] = t_sorted[:k]
    rates = np.empty(n)
    rates[order] = rates_sorted
    return rates


def allocate(policy: str, demands: Sequence[TransferDemand], capacity: float, margin: float = 0.0,
             spread_leftover: bool = False) -> list[float]:
    """Rates (bytes/s), one per demand, summing to at most ``capacity``.

    Requests with no bytes to move get 0. For the stall-opt policies, when
    every target fits under the capacity the rest stays unassigned unless
    ``spread_leftover`` (then it is shared in proportion to the targets).
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if not (capacity > 0 and math.isfinite(capacity)):
        raise ValueError(f"capacity must be a positive, finite rate, not {capacity}")
    if margin < 0 or not math.isfinite(margin):
        raise ValueError("margin must be finite and >= 0")
    n = len(demands)
    if n == 0:
        return []
    s = np.array([d.bytes_per_layer for d in demands], dtype=float)
    c = np.array([d.compute_per_layer_s for d in demands], dtype=float)
    w = np.array([d.weight for d in demands], dtype=float)
    layers = np.array([d.num_layers for d in demands], dtype=float)
    active = s > 0
    rates = np.zeros(n)
    if not active.any():
        return rates.tolist()
    if policy == "equal":
        share = w * active
        rates = capacity * share / share.sum()
    elif policy == "kv-prop":
        share = w * s * layers
        rates = capacity * share / share.sum()
    elif policy == "bw-prop":
        with np.errstate(divide="ignore"):
            zero_stall = np.where(c > 0, s / np.where(c > 0, c, 1), np.inf)
        if np.isinf(zero_stall[active]).any():
            # No compute window: such requests need all they can get; share among them by weight.
            share = w * (np.isinf(zero_stall) & active)
        else:
            share = w * np.where(active, zero_stall, 0)
        rates = capacity * share / share.sum()
    else:
        with np.errstate(divide="ignore"):
            targets = np.where(c > 0, s / np.where(c > 0, c, 1), np.inf)
        if policy == "calibrated-stall-opt":
            targets = targets + margin
        idx = np.flatnonzero(active)
        rates[idx] = water_fill(w[idx] * s[idx], targets[idx], capacity)
        leftover = capacity - rates.sum()
        if spread_leftover and leftover > 0:
            rates[idx] += leftover * rates[idx] / rates[idx].sum()
    return rates.tolist()


def objective(demands: Sequence[TransferDemand], rates: Sequence[float]) -> float:
    """``Σ w_i s_i / r_i`` over requests with bytes to move (the total per-layer transfer time)."""
    total = 0.0
    for d, r in zip(demands, rates):
        if d.bytes_per_layer > 0:
            total += d.weight * d.bytes_per_layer / r
    return total


def added_stall(demands: Sequence[TransferDemand], rates: Sequence[float]) -> list[float]:
    """Per-request added time over its whole load: ``L · max(0, s/r − c)``."""
    return [d.num_layers * max(0.0, d.bytes_per_layer / r - d.compute_per_layer_s) if d.bytes_per_layer else 0.0
            for d, r in zip(demands, rates)]
