"""The oracle's picture of a candidate, from a node's labels, config and measurements (pure functions)."""

from __future__ import annotations

import pytest

from protocol.cluster import NodeInfo
from protocol.config import ClusterConfig
from scheduler import PathRequest, Tier, choose_path
from scheduler.oracle import GBPS
from scheduler.paths import predict
from storage_server.cluster.oracle_view import NodeLoad, Telemetry, TierMap, build_view, corrected_startup, kind_of, taken_plan

A = NodeInfo("a", "127.0.0.1:1", zone="z1", rack="r1", host="host-a")
B = NodeInfo("b", "127.0.0.1:2", zone="z1", rack="r1", host="host-b")
C = NodeInfo("c", "127.0.0.1:3", zone="z2", rack="r9", host="host-c")
NODES = {n.node_id: n for n in (A, B, C)}
TIERS = TierMap.from_config(ClusterConfig())


def test_the_tier_map_comes_from_the_cluster_config():
    cfg = ClusterConfig(same_rack_gbps=40.0, cross_zone_latency_us=100.0, upstream_gbps=2.0, upstream_first_byte_ms=50.0)
    tiers = TierMap.from_config(cfg)
    assert tiers.tiers[Tier.SAME_RACK].bandwidth_bytes_per_s == 40 * GBPS
    assert tiers.tiers[Tier.CROSS_ZONE].latency_s == pytest.approx(100e-6)
    assert tiers.upstream.bandwidth_bytes_per_s == 2 * GBPS and tiers.upstream.latency_s == pytest.approx(0.05)


def test_peers_links_take_their_tier_from_the_labels_and_every_path_ends_on_the_engine_link():
    view = build_view(A, NODES, {"a": 2, "b": 5, "c": 8, "gone": 3}, 10, TIERS, NodeLoad())
    by_name = {s.name: s for s in view.sources}
    assert set(by_name) == {"local", "peer:b", "peer:c", "peer:gone", "upstream@a"}
    assert by_name["peer:b"].links == ("b->a", "a->host-a") and view.links["b->a"].tier == Tier.SAME_RACK
    assert view.links["c->a"].tier == Tier.CROSS_ZONE and view.links["gone->a"].tier == Tier.CROSS_ZONE  # unknown: far
    assert view.links["a->host-a"].tier == Tier.SAME_HOST
    assert by_name["upstream@a"].warm_chunks == 10 and by_name["upstream@a"].startup_s == pytest.approx(0.02)


def test_a_measured_rate_replaces_the_configured_bandwidth_until_it_is_stale():
    slow = NodeLoad(rates={"b->a": 1e6}, age_s=1.0)
    fresh = choose_path(PathRequest(10, 1e6, 8), build_view(A, NODES, {"b": 10}, 10, TIERS, slow, stale_after_s=30.0))
    assert fresh.sources == ("upstream@a",)  # 1 MB/s measured from B: the upstream is faster
    stale = choose_path(PathRequest(10, 1e6, 8), build_view(A, NODES, {"b": 10}, 10, TIERS, NodeLoad(rates={"b->a": 1e6}, age_s=60.0),
                                                            stale_after_s=30.0))
    assert stale.sources == ("peer:b",)  # configured same-rack 100 Gbit/s


def test_in_flight_bytes_on_a_link_slow_its_prediction():
    idle = choose_path(PathRequest(4, 1e8, 8), build_view(A, NODES, {"b": 4}, 4, TIERS, NodeLoad()), allow_split=False)
    busy = choose_path(PathRequest(4, 1e8, 8), build_view(A, NODES, {"b": 4}, 4, TIERS, NodeLoad(flows={"a->host-a": (4e9,) * 3})),
                       allow_split=False)
    assert busy.total_s > idle.total_s and busy.queued_bytes == 12e9


def test_telemetry_folds_rates_since_the_last_refresh_into_an_ewma():
    t = Telemetry(alpha=0.5)
    t.refresh({"l": (100.0, 1.0)})
    assert t.rates["l"] == 100.0  # the first sample as is
    t.refresh({"l": (400.0, 2.0)})  # 300 bytes in 1 s since the last refresh
    assert t.rates["l"] == pytest.approx(200.0)
    t.refresh({"l": (400.0, 2.0)})  # nothing moved: the rate is kept
    assert t.rates["l"] == pytest.approx(200.0)


def test_a_finished_pins_paths_become_the_plan_it_took():
    warm, plan = taken_plan("a", {"local": 3 * 256, "peer:c": 2 * 256, "peer:b": 4 * 256, "upstream": 256}, 256, 10)
    assert warm == {"a": 3, "b": 4, "c": 2}
    assert plan == [("local", 0, 3), ("peer:b", 3, 7), ("peer:c", 7, 9), ("upstream@a", 9, 10)]
    view = build_view(A, NODES, warm, 10, TIERS, NodeLoad())
    choice = predict(PathRequest(10, 256.0, 8), view, plan)
    assert [s.source for s in choice.segments] == ["local", "peer:b", "peer:c", "upstream@a"]
    assert choice.total_s >= 0.02  # the upstream's first byte
    assert taken_plan("a", {"local": 2560}, 256, 10) == ({"a": 10}, [("local", 0, 10)])


def test_the_learnt_fixed_cost_removes_a_steady_bias_and_starts_every_source_of_its_kind():
    startup, predicted_links, measured = 0.0, 0.001, 0.011  # each kv-get takes 10 ms more than its links explain
    for _ in range(40):
        startup = corrected_startup(startup, measured, predicted_links + startup, alpha=0.3)
    assert startup == pytest.approx(0.010, rel=1e-3)
    assert corrected_startup(0.001, 0.0, 0.5, alpha=1.0) == 0.0  # never negative
    load = NodeLoad(startup_s={"local": 0.01, "peer": 0.02, "upstream": 0.03})
    by_name = {s.name: s for s in build_view(A, NODES, {"a": 1, "b": 2}, 4, TIERS, load).sources}
    assert (by_name["local"].startup_s, by_name["peer:b"].startup_s) == (0.01, 0.02)
    assert by_name["upstream@a"].startup_s == pytest.approx(0.02 + 0.03)  # first byte + learnt
    assert [kind_of(p) for p in ({"local": 5}, {"local": 5, "peer:b": 5}, {"peer:b": 5, "upstream": 5})] == ["local", "peer", "upstream"]
