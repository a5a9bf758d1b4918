"""Allocation policies: the design's reference numbers, cvxpy as the reference solver, edge cases."""

from __future__ import annotations

import math

import cvxpy as cp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.config import BANDWIDTH_POLICIES
from scheduler import POLICIES, TransferDemand, allocate, objective

GBPS = 1e9 / 8
# Llama 3.1 8B on one A100 (DESIGN §7): total prefill compute in ms by (context K, hit rate).
A100 = {(16, 0.5): 955.89, (16, 0.875): 281.76, (64, 0.5): 8672.79, (64, 0.875): 2423.90}


def design_demands() -> list[TransferDemand]:
    return [TransferDemand(int(k * 1024 * hit) * 4096, ms / 1000 / 32, 32) for (k, hit), ms in A100.items()]


def gbps(rates):
    return [r / GBPS for r in rates]


def test_zero_stall_rates_match_design():
    assert gbps([d.zero_stall_rate for d in design_demands()]) == pytest.approx([8.99, 53.38, 3.96, 24.81], abs=0.05)


@pytest.mark.parametrize("policy,cap,expected", [
    ("stall-opt", 80, [8.99, 42.25, 3.96, 24.81]),
    ("calibrated-stall-opt", 80, [13.99, 27.25, 8.96, 29.81]),
    ("stall-opt", 50, [8.99, 12.35, 3.96, 24.70]),
    ("calibrated-stall-opt", 50, [8.26, 10.93, 8.96, 21.85]),
])
def test_design_reference_allocations(policy, cap, expected):
    rates = allocate(policy, design_demands(), cap * GBPS, margin=5 * GBPS)
    assert gbps(rates) == pytest.approx(expected, abs=0.05)
    assert sum(rates) == pytest.approx(cap * GBPS)


def test_baselines():
    d = design_demands()
    b = 50 * GBPS
    assert allocate("equal", d, b) == pytest.approx([b / 4] * 4)
    kv = allocate("kv-prop", d, b)
    assert kv[3] / kv[0] == pytest.approx(d[3].bytes_per_layer / d[0].bytes_per_layer)
    bw = allocate("bw-prop", d, b)
    assert bw[1] / bw[0] == pytest.approx(d[1].zero_stall_rate / d[0].zero_stall_rate)
    for rates in (kv, bw):
        assert sum(rates) == pytest.approx(b)


def test_stall_opt_beats_equal_on_total_stall():
    from scheduler import added_stall

    d = design_demands()
    for cap in (50, 80):
        eq = sum(added_stall(d, allocate("equal", d, cap * GBPS)))
        so = sum(added_stall(d, allocate("stall-opt", d, cap * GBPS)))
        assert so < eq


def cvxpy_optimum(demands, capacity, targets) -> tuple[float, float]:
    """min Σ s_i/r_i  s.t.  Σ r_i = B, 0 < r_i ≤ t_i — solved by cvxpy; the optimum and the tolerance it is good to.

    Written first in u_i = r_i / t_i (an exact change of variables: Σ (s_i/t_i)/u_i,
    Σ (t_i/B) u_i = 1, u_i ≤ 1), which keeps the interior-point solver well
    conditioned when targets span many orders of magnitude; where the solver still
    reports ``optimal_inaccurate`` (rare, for demands ~10⁴ apart), in the rates
    themselves, and an answer that is inaccurate in both is compared more loosely.
    """
    s = np.array([d.bytes_per_layer for d in demands])
    a = s / targets
    u = cp.Variable(len(demands))
    by_share = cp.Problem(cp.Minimize(cp.sum(cp.multiply(a / a.max(), cp.inv_pos(u)))), [(targets / capacity) @ u == 1, u <= 1])
    by_share.solve(solver=cp.CLARABEL)
    if by_share.status == cp.OPTIMAL:
        return by_share.value * a.max(), 1e-6
    r = cp.Variable(len(demands))
    by_rate = cp.Problem(cp.Minimize(cp.sum(cp.multiply(s / s.max(), cp.inv_pos(r / capacity)))), [cp.sum(r) == capacity, r <= targets])
    by_rate.solve(solver=cp.CLARABEL)
    if by_rate.status == cp.OPTIMAL:
        return by_rate.value * s.max() / capacity, 1e-6
    assert by_share.status == cp.OPTIMAL_INACCURATE, by_share.status
    return by_share.value * a.max(), 1e-4


demand_st = st.builds(
    TransferDemand,
    bytes_per_layer=st.floats(1e3, 1e9),
    compute_per_layer_s=st.floats(1e-4, 1.0),
    num_layers=st.integers(1, 80),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(demand_st, min_size=1, max_size=64), st.floats(0.05, 0.95), st.sampled_from([0.0, 1e8]),
       st.sampled_from(["stall-opt", "calibrated-stall-opt"]))
def test_closed_form_matches_cvxpy(demands, squeeze, margin, policy):
    """Capacity below the sum of targets (so the cap binds): the closed form is the optimum."""
    m = margin if policy == "calibrated-stall-opt" else 0.0
    targets = np.array([d.zero_stall_rate + m for d in demands])
    capacity = squeeze * targets.sum()
    rates = np.array(allocate(policy, demands, capacity, margin=margin))
    assert rates.sum() == pytest.approx(capacity, rel=1e-9)
    assert np.all(rates > 0) and np.all(rates <= targets * (1 + 1e-9))
    ours = objective(demands, rates)
    reference, tolerance = cvxpy_optimum(demands, capacity, targets)
    assert abs(ours - reference) / reference <= tolerance
    assert ours <= reference * (1 + tolerance / 10)  # never worse than the solver (beyond its feasibility tolerance)


@given(st.lists(demand_st, min_size=1, max_size=64))
def test_targets_fit_under_capacity(demands):
    targets = [d.zero_stall_rate for d in demands]
    rates = allocate("stall-opt", demands, sum(targets) * 1.5)
    assert rates == pytest.approx(targets)
    spread = allocate("stall-opt", demands, sum(targets) * 1.5, spread_leftover=True)
    assert sum(spread) == pytest.approx(sum(targets) * 1.5)


def test_degenerate_inputs():
    one = [TransferDemand(1e6, 0.01)]
    assert allocate("stall-opt", one, 1e9) == pytest.approx([1e8])  # target fits
    assert allocate("stall-opt", one, 1e7) == pytest.approx([1e7])  # all of a small pool
    no_window = [TransferDemand(1e6, 0.0), TransferDemand(4e6, 0.0)]
    assert allocate("stall-opt", no_window, 3e9) == pytest.approx([1e9, 2e9])  # λ·√s, no cap
    assert allocate("bw-prop", no_window, 3e9) == pytest.approx([1.5e9, 1.5e9])
    with_empty = [TransferDemand(0, 0.01), TransferDemand(1e6, 0.01)]
    for policy in ("equal", "kv-prop", "bw-prop", "stall-opt", "calibrated-stall-opt"):
        assert allocate(policy, with_empty, 1e7)[0] == 0.0
    assert allocate("equal", [], 1e9) == []
    for bad in (0, -1, math.inf, math.nan):
        with pytest.raises(ValueError, match="capacity"):
            allocate("stall-opt", one, bad)
    with pytest.raises(ValueError, match="unknown policy"):
        allocate("fastest", one, 1e9)
    with pytest.raises(ValueError):
        TransferDemand(-1, 0.1)
    with pytest.raises(ValueError):
        TransferDemand(1, math.nan)


def test_ten_thousand_demands():
    rng = np.random.default_rng(0)
    demands = [TransferDemand(float(s), float(c), 32) for s, c in zip(rng.uniform(1e5, 1e9, 10_000), rng.uniform(1e-3, 0.1, 10_000))]
    rates = allocate("calibrated-stall-opt", demands, 50 * GBPS, margin=5 * GBPS)
    assert len(rates) == 10_000 and sum(rates) == pytest.approx(50 * GBPS)


def test_weights_scale_the_objective():
    d = [TransferDemand(1e6, 0.0, weight=1.0), TransferDemand(1e6, 0.0, weight=4.0)]
    rates = allocate("stall-opt", d, 3e6)
    assert rates[1] / rates[0] == pytest.approx(2.0)  # √(w·s)


def test_the_contract_names_the_same_policies():
    """protocol.config names the policies without importing the scheduler; the two lists stay equal."""
    assert BANDWIDTH_POLICIES == POLICIES
