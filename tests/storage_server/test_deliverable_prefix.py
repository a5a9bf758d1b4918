"""The longest prefix a node expects to land within a load budget: the pure parts.

``deliverable_chunks`` (the answer), ``EpochScheduler.predict_rate`` (the pool's grant it rests on,
checked against what the next epoch really grants) and the ``x-oc-load-budget`` header.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import ErrorCode, S3Error
from protocol.kv_http import LoadBudget
from scheduler.epochs import EpochScheduler
from scheduler.policies import POLICIES, TransferDemand
from storage_server.deadline import DELIVERY_MARGIN, deliverable_chunks

S = 1000  # bytes of one chunk's layer


def _done_s(n: int, layers: int, burst: int, rate: float, wait: float) -> float:
    """When the last byte of an ``n``-chunk load is in place, by the model the answer must keep within the budget."""
    return wait + max(0, layers - burst) * n * S / rate


@given(hits=st.integers(0, 400), skip=st.integers(0, 50), layers=st.integers(1, 64), burst=st.integers(0, 3),
       rate=st.floats(1e3, 1e9), budget=st.floats(1e-3, 30.0), wait=st.floats(0.0, 0.05))
def test_the_answer_is_the_longest_prefix_that_fits_the_budget(hits, skip, layers, burst, rate, budget, wait):
    n = deliverable_chunks(hits, skip, layers, S, budget, lambda _: rate, burst, wait)
    assert min(hits, skip) <= n <= hits
    loaded = n - min(hits, skip)
    if loaded and burst < layers:
        assert _done_s(loaded, layers, burst, rate, wait) <= DELIVERY_MARGIN * budget + 1e-9
    if n < hits:  # one chunk more would not fit
        assert _done_s(loaded + 1, layers, burst, rate, wait) > DELIVERY_MARGIN * budget - 1e-9


def test_worked_examples():
    # 4 chunks' layer per second, 2 layers: (0.75·4 − 0.01)·4/2 = 5.98 → 5 of 8.
    assert deliverable_chunks(8, 0, 2, S, 4.0, lambda _: 4 * S, 0, 0.01) == 5
    assert deliverable_chunks(8, 2, 2, S, 4.0, lambda _: 4 * S, 0, 0.01) == 7       # two already held cost nothing
    assert deliverable_chunks(8, 0, 2, S, 0.1, lambda _: 4 * S, 0, 0.01) == 0       # 100 ms: nothing lands
    assert deliverable_chunks(8, 0, 2, S, 0.1, lambda _: math.inf, 0, 0.0) == 8     # unpaced: all
    assert deliverable_chunks(8, 0, 2, S, 0.1, lambda _: 4 * S, 2, 0.0) == 8        # burst covers every layer
    assert deliverable_chunks(8, 0, 2, S, 4.0, lambda _: 0.0, 0, 0.0) == 0          # no bandwidth free now
    assert deliverable_chunks(3, 5, 2, S, 0.1, lambda _: 4 * S, 0, 0.0) == 3        # all held already


def test_a_smaller_demand_that_gets_a_smaller_rate_shrinks_the_answer_again():
    asked = []

    def rate(n: int) -> float:  # a zero-stall-like grant: proportional to the demand
        asked.append(n)
        return n * S / 2.0

    # A layer takes 2 s whatever n is: two never fit 0.75·3 s, but only asking again for the smaller n shows it.
    assert deliverable_chunks(10, 0, 2, S, 3.0, rate) == 0
    assert asked == [10, 5, 2, 1]


@pytest.mark.parametrize("policy", POLICIES)
def test_predict_rate_is_what_the_next_epoch_grants(policy):
    def pool() -> EpochScheduler:  # one load running (held to 40 MB/s by its tenant's cap), one waiting
        sched = EpochScheduler(policy, capacity=100e6, epoch_s=0.01, tenant_caps={"capped": 30e6, "old": 40e6})
        sched.submit("old", TransferDemand(4e6, 0.01, 8), "old")
        sched.run_epoch()
        sched.submit("waiting", TransferDemand(2e6, 0.02, 8), "capped")
        return sched

    sched = pool()
    for tenant in ("a", "capped", "old"):
        demand = TransferDemand(3e6, 0.005, 8)
        predicted = sched.predict_rate(demand, tenant)
        twin = pool()
        twin.submit("new", demand, tenant)
        granted = {a.request_id: a.rate for a in twin.run_epoch()}
        assert predicted == pytest.approx(granted.get("new", 0.0)), (policy, tenant, granted)
        assert (predicted > 0) == (tenant != "old"), "a tenant at its cap waits"
    assert list(sched.waiting) == ["waiting"], "predicting changes nothing"


def test_predict_rate_counts_bandwidth_a_finished_load_returns():
    sched = EpochScheduler("equal", capacity=10e6, epoch_s=0.01)
    sched.submit("a", TransferDemand(1e6, 0.0, 2))
    sched.run_epoch()
    assert sched.predict_rate(TransferDemand(1e6, 0.0, 2)) == 0.0, "all bandwidth is held: it would wait for a later epoch"
    sched.finish("a")
    assert sched.predict_rate(TransferDemand(1e6, 0.0, 2)) == pytest.approx(10e6)


def test_the_budget_header_round_trips_and_refuses_nonsense():
    b = LoadBudget(0.25, 28, 65536, 3)
    assert LoadBudget.from_header(b.to_header()) == b
    for bad in ("", "0.1;2;3", "0;2;3;0", "nan;2;3;0", "inf;2;3;0", "0.1;0;3;0", "0.1;2;0;0", "0.1;2;3;-1", "x;2;3;0", "0.1;2;3;0;9"):
        with pytest.raises(S3Error) as e:
            LoadBudget.from_header(bad)
        assert e.value.code == ErrorCode.InvalidArgument and "x-oc-load-budget" in e.value.message
