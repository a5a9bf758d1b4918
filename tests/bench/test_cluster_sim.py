"""The cluster simulator's parts: max-min fair sharing against hand-worked cases, workloads, topology, invariants of a run."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.cluster_sim_dualpath import simulate as dualpath_run
from bench.cluster_sim_models import PROFILES, SAMPLE_TRACE, agentic_records, load_records, workload
from bench.cluster_sim_net import Clock, Fabric
from bench.cluster_sim_netkv import DECODE, PREFILL, Topology, simulate, tier
from scheduler import Tier


def finish_times(capacity, flows):
    fabric = Fabric(list(capacity))
    clock = Clock(fabric)
    done = {}
    for name, (start, links, nbytes, cap) in flows.items():
        clock.at(start, lambda t, name=name, links=links, nbytes=nbytes, cap=cap:
                 fabric.add(t, links, nbytes, lambda t2, name=name: done.setdefault(name, t2), cap))
    clock.run()
    return done, fabric


def test_max_min_fair_sharing_by_hand():
    # Link 0 (10/s) carries a, b, c; link 1 (4/s) carries b; c is capped at 1/s. Then: c=1, b=4, a=5.
    done, fabric = finish_times([10.0, 4.0], {"a": (0, (0,), 10, math.inf), "b": (0, (0, 1), 10, math.inf), "c": (0, (0,), 3, 1.0)})
    assert done == pytest.approx({"a": 2.0, "b": 2.5, "c": 3.0})
    assert fabric.busy_bytes == pytest.approx([23.0, 10.0])


def test_a_late_flow_takes_its_share_and_gives_it_back():
    done, _ = finish_times([1.0], {"long": (0, (0,), 2, math.inf), "short": (1, (0,), 0.5, math.inf)})
    # long alone for 1 s (1 byte), then both at 0.5/s: short ends at 2, long has 0.5 left at 1/s.
    assert done == pytest.approx({"short": 2.0, "long": 2.5})



def test_a_flow_that_ends_within_the_tolerance_counts_its_last_bytes_as_carried():
    """Flows finish with up to EPS_BYTES left; those bytes count for the link (hypothesis found 5.10078 of 5.10156)."""
    flows = [(0.0, (0,), 1.0, math.inf)] * 3 + [(0.0, (0,), 0.1015625, math.inf), (0.0, (1,), 1.0, math.inf),
                                                (1.0, (0,), 1.0, math.inf), (0.015625, (0,), 1.0, math.inf)]
    _, fabric = finish_times([1.0, 2.0, 5.0, 0.5], dict(enumerate(flows)))
    assert fabric.busy_bytes[0] == pytest.approx(5.1015625, rel=1e-9)

@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5), st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True),
                          st.floats(0.1, 50), st.sampled_from([math.inf, 0.5, 2.0])), min_size=1, max_size=12))
def test_every_flow_finishes_and_no_link_carries_more_than_its_capacity(flows):
    capacity = [1.0, 2.0, 5.0, 0.5]
    done, fabric = finish_times(capacity, {i: (s, tuple(links), b, cap) for i, (s, links, b, cap) in enumerate(flows)})
    assert set(done) == set(range(len(flows)))
    end = max(done.values())
    for link, carried in enumerate(fabric.busy_bytes):
        assert carried == pytest.approx(sum(b for _, links, b, _ in flows if link in links), rel=1e-6, abs=1e-6)
        assert carried <= capacity[link] * end * (1 + 1e-9) + 1e-6
    for i, (start, links, nbytes, cap) in enumerate(flows):  # nothing beats its own bottleneck
        assert done[i] - start >= nbytes / min([capacity[k] for k in links] + [cap]) * (1 - 1e-9)


def test_topology_tiers_and_paths():
    topo = Topology(4.0)
    assert all(tier(p, q) == Tier.SAME_HOST for p, q in ((0, 1), (2, 3)))
    assert tier(0, 2) == Tier.SAME_RACK and tier(0, 4) == Tier.SAME_ZONE and tier(0, 8) == Tier.CROSS_ZONE
    assert topo.group_path(0, 9) == ["up0", "rackup0", "podup0", "poddown1", "rackdown2", "down9"]
    # The prefill pool fills rack 0, so every transfer crosses the aggregation layer (NetKV's Table VI).
    assert {tier(p, d) for p in PREFILL for d in DECODE} == {Tier.SAME_ZONE, Tier.CROSS_ZONE}
    assert topo.tier_bw[Tier.CROSS_ZONE] == 2 * Topology(8.0).tier_bw[Tier.CROSS_ZONE]


def test_a_workload_keeps_the_profile_and_the_asked_rate():
    records = load_records(SAMPLE_TRACE)
    reqs = workload(records, PROFILES["rag"], 2.0, 100.0, 0)
    assert all(8193 <= r.input_tokens <= 16384 for r in reqs)
    assert len(reqs) / 100.0 == pytest.approx(2.0, rel=0.15)
    assert [r.arrival for r in reqs] == sorted(r.arrival for r in reqs) and reqs[-1].arrival < 100.0
    with pytest.raises(ValueError, match="no requests"):
        workload([{"timestamp": 0, "input_length": 10, "hash_ids": [1]}], PROFILES["rag"], 1.0, 10.0, 0)


def test_netkv_runs_measure_every_request_and_the_static_map_shifts_transfers_into_the_pod():
    records = load_records(SAMPLE_TRACE)
    reqs = workload(records, PROFILES["rag"], 1.5, 30.0, 3)
    rr = simulate(reqs, PROFILES["rag"], "round-robin", 0.2, 3, 3.0, 30.0)
    static = simulate(reqs, PROFILES["rag"], "netkv-static", 0.2, 3, 3.0, 30.0)
    measured = sum(1 for r in reqs if r.arrival >= 3.0)
    assert rr["requests"] == static["requests"] == measured
    share = static["transfer_tier_share"]
    assert share["same_zone"] > rr["transfer_tier_share"]["same_zone"] and math.isclose(sum(share.values()), 1.0)
    assert static["mean_transfer_s"] < rr["mean_transfer_s"]
    for s in (rr, static):
        assert 0 < s["p50_ttft_s"] <= s["p99_ttft_s"] and 0 <= s["slo_attainment"] <= 1
        assert all(0 <= u <= 1 for u in s["tier_utilisation"].values())


def test_dualpath_single_path_reads_only_through_prefill_nodes():
    records = agentic_records(12, (16384, 20480), 24576, 0)
    assert all(r["timestamp"] == 0 for r in records)
    single = dualpath_run(records, "single-path", 1, 1)
    both = dualpath_run(records, "dualpath", 1, 1)
    assert single["turns"] == both["turns"] == len(records)
    # Decode nodes' storage NICs carry only write-backs under the single path; reads move there with DualPath.
    assert single["storage_nic_utilisation"]["decode_nodes"] < both["storage_nic_utilisation"]["decode_nodes"]
