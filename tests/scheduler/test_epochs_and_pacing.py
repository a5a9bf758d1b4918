"""Epoch admission (injected clock) and the pacing primitives."""

from __future__ import annotations

import pytest

from scheduler import TransferDemand
from scheduler.epochs import EpochScheduler
from scheduler.pacing import DeficitRoundRobin, TokenBucket


def demand(s=1e6, c=0.01):
    return TransferDemand(s, c, 32)


def test_arrival_mid_epoch_waits_for_the_next_boundary():
    sched = EpochScheduler("stall-opt", capacity=1e9, epoch_s=0.010, start=0.0)
    sched.submit("a", demand())
    assert sched.boundary_after(0.003) == pytest.approx(0.010)
    assert sched.running == {}  # nothing runs before the boundary
    admitted = sched.run_epoch()
    assert [a.request_id for a in admitted] == ["a"] and sched.running["a"].rate == pytest.approx(1e8)


def test_rates_are_kept_and_release_returns_at_the_next_epoch():
    sched = EpochScheduler("stall-opt", capacity=1e8, epoch_s=0.01)
    sched.submit("a", demand(1e6, 0.001))  # wants 1e9: takes the whole pool
    sched.run_epoch()
    assert sched.allocated == pytest.approx(1e8)
    sched.submit("b", demand())
    assert sched.run_epoch() == []  # no free bandwidth: b waits, a keeps its rate
    assert sched.running["a"].rate == pytest.approx(1e8)
    sched.finish("a")
    assert sched.allocated == pytest.approx(1e8)  # still held until the boundary
    admitted = sched.run_epoch()
    assert [x.request_id for x in admitted] == ["b"] and "a" not in sched.running
    assert sched.running["b"].rate == pytest.approx(1e8)  # min(target 1e8, pool 1e8)


def test_tenant_caps_and_weights():
    sched = EpochScheduler("stall-opt", capacity=1e9, epoch_s=0.01, tenant_caps={"small": 1e8}, tenant_weights={"vip": 4.0})
    sched.submit("s1", demand(1e6, 0.0), tenant="small")
    sched.submit("v1", demand(1e6, 0.0), tenant="vip")
    sched.submit("n1", demand(1e6, 0.0), tenant="normal")
    sched.run_epoch()
    r = {k: a.rate for k, a in sched.running.items()}
    assert r["s1"] == pytest.approx(1e8)  # capped
    assert r["v1"] / r["n1"] == pytest.approx(2.0)  # √4
    assert sum(r.values()) <= 1e9 * (1 + 1e-9)


def test_cancel_while_waiting():
    sched = EpochScheduler("equal", capacity=1e9, epoch_s=0.01)
    sched.submit("a", demand())
    sched.finish("a")
    assert sched.run_epoch() == [] and not sched.waiting


def test_token_bucket_long_run_rate():
    bucket = TokenBucket(rate=1e6, burst=1e5)
    now, sent = 0.0, 0
    for _ in range(100):
        now += bucket.reserve(1e5, now)
        sent += 1e5
    # 100 × 100 kB at 1 MB/s; one layer of burst credit lets the first two go at t=0.
    assert sent == 1e7 and now == pytest.approx(98 * 0.1)


def test_deficit_round_robin_serves_in_proportion_to_quanta():
    drr = DeficitRoundRobin()
    drr.add_flow("fast", quantum=3.0)
    drr.add_flow("slow", quantum=1.0)
    for i in range(400):
        drr.enqueue("fast", 1.0, ("fast", i))
        drr.enqueue("slow", 1.0, ("slow", i))
    served = [drr.pop()[0] for _ in range(400)]
    assert served.count("fast") == pytest.approx(300, abs=3)
    assert [x[1] for x in [drr.pop() for _ in range(2)]]  # still serving
    drr.remove_flow("fast")
    assert all(drr.pop()[0] == "slow" for _ in range(len(drr)))
    assert drr.pop() is None
