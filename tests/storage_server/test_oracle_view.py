"""The oracle's picture of a candidate, from a node's labels, config and measurements (pure functions)."""

from __future__ import annotations

import pytest

from protocol.cluster import NodeInfo
from protocol.config import ClusterConfig
from scheduler import PathRequest, Tier, choose_path
from scheduler.oracle import GBPS
from scheduler.paths import predict
from storage_server.cluster.estimator import stale_count
from storage_server.cluster.oracle_view import UPSTREAM_REQUESTS, FixedCosts, NodeLoad, Telemetry, TierMap, build_view, corrected_startup, fixed_cost, kind_of, taken_plan

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


def test_a_finished_pins_record_becomes_the_plan_it_took():
    # The fetcher's record: shares in the order it planned them; the rest of the kv-get was in this node's cache.
    warm, plan, helpers = taken_plan("a", {}, 10, [("peer:b", 4), ("peer:c", 2), ("upstream@b", 1), ("upstream@a", 1)])
    assert warm == {"a": 2, "b": 10, "c": 10} and helpers == ["b"]
    assert plan == [("local", 0, 2), ("peer:b", 2, 6), ("peer:c", 6, 8), ("upstream@b", 8, 9), ("upstream@a", 9, 10)]
    view = build_view(A, NODES, warm, 10, TIERS, NodeLoad(), helpers=helpers)
    choice = predict(PathRequest(10, 256.0, 8), view, plan)
    assert [s.source for s in choice.segments] == ["local", "peer:b", "peer:c", "upstream@b", "upstream@a"]
    assert choice.total_s >= 0.02  # the upstream's first byte
    assert taken_plan("a", {"local": 2560}, 10) == ({"a": 10}, [("local", 0, 10)], [])


def test_without_a_record_the_pins_bytes_are_shared_out_in_proportion_so_compressed_chunks_count_whole():
    # 10 chunks compressed to 100 bytes each (a raw one is 256): bytes // raw size would count 3 local, 0 from C.
    warm, plan, _ = taken_plan("a", {"local": 300, "peer:b": 400, "peer:c": 200, "upstream": 100}, 10)
    assert warm == {"a": 3, "b": 10, "c": 10}
    assert plan == [("local", 0, 3), ("peer:b", 3, 7), ("peer:c", 7, 9), ("upstream@a", 9, 10)]


def test_fixed_costs_are_learnt_from_the_first_kv_get_on_and_a_steady_bias_goes_to_zero():
    startup, predicted_links, measured = 0.0, 0.001, 0.011  # each kv-get takes 10 ms more than its links explain
    startup = corrected_startup(startup, measured, predicted_links + startup, alpha=0.3, samples=0)
    assert startup == pytest.approx(0.010)  # the first measurement is taken whole (a mean of one) ...
    for n in range(1, 40):
        startup = corrected_startup(startup, measured + (0.004 if n % 2 else -0.004), predicted_links + startup, alpha=0.3, samples=n)
    assert startup == pytest.approx(0.010, abs=0.003)  # ... then an EWMA through the noise
    assert corrected_startup(0.001, 0.0, 0.5, alpha=1.0) == 0.0  # never negative


def test_the_pin_and_its_critical_source_teach_their_own_costs_and_every_kv_get_teaches_delivery():
    costs = FixedCosts(alpha=0.3)
    # A local kv-get: its pin took 5 ms (predicted 0), its first layer came 25 ms after arrival (predicted 1 ms).
    costs.observe(0.005, 0.025, 0.0, 0.001)
    assert costs.seconds == pytest.approx({"pin": 0.005, "deliver": 0.019})
    # A kv-get fetched from B: its pin took 80 ms where 30 ms was predicted with the peer kind's 0 s.
    costs.observe(0.080, 0.100, 0.030, 0.050, critical="peer:b", used_s=0.0, kind="peer")
    assert costs.seconds["peer:b"] == costs.seconds["peer"] == costs.seconds["fetch"] == pytest.approx(0.050)
    # The upstream kind has not been measured: its first share starts from what any fetch paid.
    first_up = {s.name: s for s in build_view(A, NODES, {}, 4, TIERS, NodeLoad(startup_s=dict(costs.seconds))).sources}["upstream@a"]
    assert first_up.startup_s == pytest.approx(0.005 + 0.02 + 0.05)
    assert costs.seconds["deliver"] == pytest.approx(0.019)  # its delivery took the 20 ms predicted
    # C has no cost of its own yet: it starts from the kind's; a helper starts from the upstream's and a peer's.
    load = NodeLoad(startup_s={**costs.seconds, "upstream": 0.1})
    by_name = {s.name: s for s in build_view(A, NODES, {"a": 1, "b": 2, "c": 2}, 4, TIERS, load, helpers=["c"]).sources}
    assert by_name["local"].startup_s == pytest.approx(0.005 + 0.019)
    assert by_name["peer:b"].startup_s == pytest.approx(0.005 + 0.05) and by_name["peer:c"].startup_s == pytest.approx(0.005 + 0.05)
    assert by_name["peer:b"].deliver_s == pytest.approx(0.019)
    assert by_name["upstream@a"].startup_s == pytest.approx(0.005 + 0.02 + 0.1)  # first byte + learnt
    assert by_name["upstream@c"].startup_s == pytest.approx(0.005 + 0.02 + 0.1 + 0.05)
    assert [kind_of(s) for s in ("peer:b", "upstream@c", "local")] == ["peer", "upstream", "local"]
    assert fixed_cost({"peer": 0.1}, "peer:b") == 0.1 and fixed_cost({"peer": 0.1, "peer:b": 0.2}, "peer:b") == 0.2


def test_a_helpers_share_is_stored_then_forwarded_and_delivery_waits_for_every_fetch():
    """The upstream at 1 MB/s per node, peer links at 1 MB/s, the engine link much faster: a helper's share of 1 MB
    lands after its GETs (1 s) and then its stream here (1 s), never both at once."""
    cfg = ClusterConfig(same_rack_gbps=8e-3, cross_zone_gbps=8e-3, upstream_gbps=8e-3, upstream_first_byte_ms=0.0)
    tiers = TierMap.from_config(cfg)
    view = build_view(A, NODES, {"a": 0}, 2, tiers, NodeLoad(), helpers=["b"], chunk_bytes=1e6)
    choice = predict(PathRequest(2, 1e6, 10), view, [("upstream@a", 0, 1), ("upstream@b", 1, 2)])
    ends = {s.source: s.fetched_s for s in choice.segments}
    assert ends["upstream@a"] == pytest.approx(1.0, rel=1e-3) and ends["upstream@b"] == pytest.approx(2.0, rel=1e-3)
    # The first layer (one tenth of 2 MB over the 200 Gbit/s engine link) follows the last share at once.
    assert choice.first_layer_s == pytest.approx(2.0, rel=1e-3) and choice.total_s == pytest.approx(2.0, rel=1e-3)
    batched = build_view(A, NODES, {"a": 0}, 4, tiers, NodeLoad(), helpers=["b"], chunk_bytes=1e6, relay_batch_chunks=2)
    c4 = predict(PathRequest(4, 1e6, 10), batched, [("upstream@b", 0, 4)])  # 4 s of GETs; the last batch's 2 s stream after
    assert c4.segments[0].fetched_s == pytest.approx(6.0, rel=1e-3)


def test_a_pins_revalidating_heads_come_before_everything_it_moves():
    tiers = TierMap.from_config(ClusterConfig(upstream_first_byte_ms=50.0, upstream_store_streams=2), upstream_streams=4)
    assert tiers.revalidation_s(0) == 0.0
    assert tiers.revalidation_s(5) == pytest.approx(3 * 0.05)  # two at once: the store serves no more
    plain = build_view(A, NODES, {"a": 4, "b": 10}, 10, TIERS, NodeLoad())
    stale = build_view(A, NODES, {"a": 4, "b": 10}, 10, TIERS, NodeLoad(), revalidate_s=0.3)
    for before, after in zip(plain.sources, stale.sources):
        assert after.startup_s == pytest.approx(before.startup_s + 0.3)
    assert stale_count({"x": 100.0, "y": 30.0}, ["x", "y", "never"], after_s=60.0, now=120.0) == 2


def test_the_stores_measured_request_rate_replaces_the_configured_first_byte_on_every_upstream_link():
    tiers = TierMap.from_config(ClusterConfig(upstream_first_byte_ms=100.0, upstream_gbps=80.0, upstream_store_streams=1), upstream_streams=4)
    configured = build_view(A, NODES, {}, 8, tiers, NodeLoad(), chunk_bytes=1e5, helpers=["b"])
    measured = build_view(A, NODES, {}, 8, tiers, NodeLoad(rates={UPSTREAM_REQUESTS: 50.0}), chunk_bytes=1e5, helpers=["b"])
    for name in ("upstream->a", "upstream->b", "upstream"):
        assert configured.links[name].measured_bytes_per_s is None
        assert measured.links[name].effective_bytes_per_s() == pytest.approx(1 / (1 / 5e6 + 1 / 1e10))  # 50 GETs of 100 kB a second
    assert tiers.revalidation_s(10, requests_per_s=50.0) == pytest.approx(0.2)


def test_the_stores_request_rate_is_tallied_only_at_a_pins_concurrency():
    from storage_server.store.s3.upstream import RequestTally

    t = RequestTally(full=2)
    t.begin()
    t.end()  # a lone request (a heartbeat's read) says nothing of the rate at a pin's concurrency
    assert (t.done, t.busy_s) == (0, 0.0)
    for _ in range(3):
        t.begin()
    t.end()
    t.end()  # two answered while two or more were in flight; the last alone
    t.end()
    assert t.done == 2 and t.busy_s > 0 and t.inflight == 0


def test_a_pins_revalidating_heads_teach_one_heads_time_not_the_pins():
    costs = FixedCosts(alpha=0.3)
    costs.observe(0.005, 0.025, 0.0, 0.001)  # a pin with nothing to check: 5 ms
    # 10 HEADs predicted at 20 ms each (0.2 s) took 0.405 s with the pin's 5 ms: one HEAD ~40 ms; the pin stays.
    costs.observe(0.405, 0.425, 0.205, 0.206, heads=10, heads_s=0.2)
    assert costs.seconds["pin"] == pytest.approx(0.005) and costs.seconds["revalidate"] == pytest.approx(0.04)


def test_a_learnt_landing_rate_is_one_link_every_fetched_share_crosses_and_the_stores_rate_too():
    load = NodeLoad(rates={UPSTREAM_REQUESTS: 500.0}, ingest_bytes_per_s=40e6)
    view = build_view(A, NODES, {"a": 1, "b": 3}, 6, TIERS, load, chunk_bytes=262144.0, helpers=["c"])
    by_name = {s.name: s for s in view.sources}
    assert by_name["peer:b"].links == ("b->a", "ingest->a", "a->host-a")
    assert by_name["upstream@a"].links == ("upstream->a", "ingest->a", "a->host-a")
    assert by_name["upstream@c"].links[-2:] == ("ingest->a", "a->host-a") and by_name["local"].links == ("a->host-a",)
    assert view.links["ingest->a"].effective_bytes_per_s() == 40e6
    # The node's own fetches measured the store, GETs and landing together: that rate, not the request-rate model's.
    assert view.links["upstream->a"].effective_bytes_per_s() == 40e6
    assert "ingest->a" not in build_view(A, NODES, {"b": 3}, 6, TIERS, NodeLoad()).links  # not learnt: the links alone


def test_the_lines_fixed_part_starts_the_nodes_own_upstream_share_whatever_the_residuals_taught():
    # A big fetch's noise taught the upstream's residual-learnt cost 90 ms; the line (fixed part 14 ms) puts it on the slope.
    load = NodeLoad(startup_s={"pin": 0.004, "upstream@a": 0.09, "peer": 0.03}, ingest_bytes_per_s=44e6, fetch_intercept_s=0.014)
    by_name = {s.name: s for s in build_view(A, NODES, {"b": 3}, 6, TIERS, load, revalidate_s=0.002).sources}
    assert by_name["upstream@a"].startup_s == pytest.approx(0.002 + 0.014)  # stale chunks' HEADs, then the line's start
    assert by_name["peer:b"].startup_s == pytest.approx(0.004 + 0.002 + 0.03)  # a peer's share keeps its learnt cost
    # A helper not measured yet: its GETs cost what this node's line puts beyond a pin and a first byte, then a peer stream.
    helped = {s.name: s for s in build_view(A, NODES, {"c": 0}, 6, TIERS, load, helpers=["c"]).sources}
    assert helped["upstream@c"].startup_s == pytest.approx(0.004 + 0.02 + max(0.0, 0.014 - 0.004 - 0.02) + 0.03)
    without = {s.name: s for s in build_view(A, NODES, {}, 6, TIERS, NodeLoad(startup_s=load.startup_s)).sources}
    assert without["upstream@a"].startup_s == pytest.approx(0.004 + 0.02 + 0.09)  # no line yet: as before


def test_the_pins_prior_stands_until_a_pin_with_nothing_to_fetch_teaches_it():
    prior = NodeLoad(pin_prior_s=0.006)
    assert {s.name: s for s in build_view(A, NODES, {"a": 4}, 4, TIERS, prior).sources}["local"].startup_s == pytest.approx(0.006)
    learnt = NodeLoad(startup_s={"pin": 0.002}, pin_prior_s=0.006)
    assert {s.name: s for s in build_view(A, NODES, {"a": 4}, 4, TIERS, learnt).sources}["local"].startup_s == pytest.approx(0.002)
    costs = FixedCosts(alpha=0.3)
    costs.observe(0.008, 0.010, 0.006, 0.007)  # a local kv-get predicted with the prior's 6 ms took 8 ms
    assert costs.seconds["pin"] == pytest.approx(0.008)  # the first is taken whole, whatever the prior was
