"""The path scheduler and the oracle's cost model as pure functions: ties, saturated links, stale congestion, a peer gone."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import LinkView, NoPath, OracleView, PathRequest, Placement, Source, SourceKind, Tier, choose_path, ewma, ps_seconds, schedule_batch, tier_between
from scheduler.oracle import estimate_path, modelled_ttft

GB = 1e9
UP = SourceKind.UPSTREAM


def view(sources, links, stale_after_s=math.inf) -> OracleView:
    return OracleView(tuple(sources), {link.name: link for link in links}, stale_after_s)


def req(n=10, chunk=1e8, layers=32, first=0, compute=0.0) -> PathRequest:
    return PathRequest(n, chunk, layers, first, compute)


def test_tier_map_from_labels():
    a = Placement("h1", "r1", "z1")
    assert tier_between(a, Placement("h1", "r9", "z9")) == Tier.SAME_HOST
    assert tier_between(a, Placement("h2", "r1", "z1")) == Tier.SAME_RACK
    assert tier_between(a, Placement("h2", "r2", "z1")) == Tier.SAME_ZONE
    assert tier_between(a, Placement("h2", "r1", "z2")) == Tier.CROSS_ZONE
    # Unknown labels never match: a node without labels is rated far, not near.
    assert tier_between(Placement("h1"), Placement("h2")) == Tier.CROSS_ZONE
    assert tier_between(Placement("h1", "", "z1"), Placement("h2", "", "z1")) == Tier.SAME_ZONE


def test_ewma_starts_at_the_first_sample_and_converges():
    x = ewma(None, 10.0, 0.3)
    assert x == 10.0
    for _ in range(60):
        x = ewma(x, 2.0, 0.3)
    assert x == pytest.approx(2.0, rel=1e-6)
    with pytest.raises(ValueError):
        ewma(x, -1.0, 0.3)


def test_processor_sharing_time_counts_only_what_is_ahead():
    link = LinkView("l", 1 * GB)
    assert ps_seconds(link, 1 * GB) == pytest.approx(1.0)
    assert ps_seconds(link.with_flow(5 * GB), 1 * GB) == pytest.approx(2.0)  # a bigger flow shares all the way
    assert ps_seconds(link.with_flow(0.25 * GB), 1 * GB) == pytest.approx(1.25)  # a smaller one leaves early
    # Background traffic and the allocator's reservations come out of the pool first.
    assert ps_seconds(LinkView("l", 1 * GB, background=0.5), 1 * GB) == pytest.approx(2.0)
    assert ps_seconds(LinkView("l", 1 * GB, reserved_bytes_per_s=0.75 * GB), 1 * GB) == pytest.approx(4.0)


def test_a_fresh_measured_rate_replaces_the_configured_one_and_a_stale_one_does_not():
    link = LinkView("l", 1 * GB, measured_bytes_per_s=0.5 * GB, age_s=2.0)
    assert link.effective_bytes_per_s(stale_after_s=5.0) == pytest.approx(0.5 * GB)
    assert link.effective_bytes_per_s(stale_after_s=1.0) == pytest.approx(1 * GB)


def test_first_layer_and_whole_payload_on_one_path():
    e = estimate_path([LinkView("a", 1 * GB, latency_s=0.001), LinkView("b", 2 * GB, latency_s=0.002)], 3.2 * GB, 32)
    assert e.total_s == pytest.approx(0.003 + 3.2)
    assert e.first_layer_s == pytest.approx(0.003 + 0.1)
    assert modelled_ttft(e.first_layer_s, e.total_s, 32, 0.0) == pytest.approx(e.total_s)
    # Compute slower than the transfer: the layers wait for the GPU, not the network.
    assert modelled_ttft(0.1, 3.2, 32, 1.0) == pytest.approx(0.1 + 31 * 1.0 + 1.0)


def test_equal_predictions_tie_break_to_the_nearer_kind_then_the_name():
    links = [LinkView("p1", 1 * GB), LinkView("p2", 1 * GB), LinkView("u", 1 * GB)]
    sources = [Source("upstream@a", UP, 10**6, ("u",)), Source("peer:b", SourceKind.PEER, 10, ("p2",)),
               Source("peer:a", SourceKind.PEER, 10, ("p1",))]
    assert choose_path(req(), view(sources, links), allow_split=False).sources == ("peer:a",)
    # Fewer queued bytes beat the name when the predictions still tie (flows that end before ours would not).
    links[0] = links[0].with_flow(0.0001)
    assert choose_path(req(), view(sources, links), allow_split=False).sources == ("peer:b",)


def test_a_saturated_link_sends_the_load_elsewhere():
    links = [LinkView("peer", 10 * GB, background=0.99, age_s=0.5), LinkView("up", 1 * GB)]
    sources = [Source("peer:b", SourceKind.PEER, 10, ("peer",)), Source("upstream@a", UP, 10**6, ("up",))]
    c = choose_path(req(), view(sources, links, stale_after_s=5.0))
    assert "upstream@a" in c.sources
    # Without congestion the fast peer link takes most of it.
    links[0] = LinkView("peer", 10 * GB)
    c = choose_path(req(), view(sources, links, stale_after_s=5.0))
    assert c.segments[0].source == "peer:b" and c.segments[0].end_chunk - c.segments[0].first_chunk >= 8


def test_stale_congestion_falls_back_to_the_static_tier_map():
    links = [LinkView("peer", 10 * GB, background=0.99, age_s=30.0), LinkView("up", 1 * GB)]
    sources = [Source("peer:b", SourceKind.PEER, 10, ("peer",)), Source("upstream@a", UP, 10**6, ("up",))]
    fresh = choose_path(req(), view(sources, links, stale_after_s=60.0), allow_split=False)
    stale = choose_path(req(), view(sources, links, stale_after_s=5.0), allow_split=False)
    assert fresh.sources == ("upstream@a",) and stale.sources == ("peer:b",)


def test_a_peer_gone_is_never_chosen():
    links = [LinkView("peer", 10 * GB), LinkView("up", 1 * GB)]
    gone = [Source("peer:b", SourceKind.PEER, 10, ("peer",), alive=False), Source("upstream@a", UP, 10**6, ("up",))]
    assert choose_path(req(), view(gone, links)).sources == ("upstream@a",)
    with pytest.raises(NoPath):
        choose_path(req(), view(gone[:1], links))
    # A source whose link the view no longer has is gone too.
    assert choose_path(req(), view([Source("peer:c", SourceKind.PEER, 10, ("nowhere",)), gone[1]], links)).sources == ("upstream@a",)


def test_a_split_over_two_disjoint_equal_paths_halves_the_time():
    links = [LinkView("a", 1 * GB), LinkView("b", 1 * GB)]
    sources = [Source("peer:a", SourceKind.PEER, 10, ("a",)), Source("peer:b", SourceKind.PEER, 10, ("b",))]
    single = choose_path(req(), view(sources, links), allow_split=False)
    split = choose_path(req(), view(sources, links))
    assert single.total_s == pytest.approx(1.0) and split.total_s == pytest.approx(0.5)
    assert [(s.first_chunk, s.end_chunk) for s in split.segments] == [(0, 5), (5, 10)]
    # Through one shared bottleneck a split gains nothing, so the single path (fewer segments) wins.
    shared = [LinkView("a", 10 * GB), LinkView("b", 10 * GB), LinkView("engine", 1 * GB)]
    both = [Source("peer:a", SourceKind.PEER, 10, ("a", "engine")), Source("peer:b", SourceKind.PEER, 10, ("b", "engine"))]
    c = choose_path(req(), view(both, shared))
    assert len(c.segments) == 1 and c.total_s == pytest.approx(1.0)


def test_a_split_front_is_limited_to_the_chunks_warm_there():
    links = [LinkView("peer", 100 * GB), LinkView("up", 1 * GB)]
    sources = [Source("peer:b", SourceKind.PEER, 3, ("peer",)), Source("upstream@a", UP, 10**6, ("up",))]
    c = choose_path(req(first=1), view(sources, links))
    assert [(s.source, s.first_chunk, s.end_chunk) for s in c.segments] == [("peer:b", 1, 3), ("upstream@a", 3, 10)]
    assert choose_path(req(first=10), view(sources, links)).segments == ()


def test_a_batch_balances_two_paths_by_their_queues():
    links = [LinkView("pe-nic", 1 * GB), LinkView("de-nic", 1 * GB), LinkView("cnic", 50 * GB)]
    sources = [Source("prefill-side", UP, 10**6, ("pe-nic",)), Source("decode-side", UP, 10**6, ("de-nic", "cnic"))]
    choices, after = schedule_batch([req()] * 4, view(sources, links), allow_split=False)
    assert sorted(c.sources[0] for c in choices) == ["decode-side", "decode-side", "prefill-side", "prefill-side"]
    assert len(after.links["pe-nic"].flows) == len(after.links["de-nic"].flows) == 2
    # The fourth request waits behind one transfer on its side, not three.
    assert choices[-1].total_s == pytest.approx(2.0, rel=1e-6)


@st.composite
def views(draw):
    n_links = draw(st.integers(1, 5))
    links = [LinkView(f"l{i}", draw(st.floats(1e6, 1e11)), latency_s=draw(st.floats(0, 0.01)),
                      background=draw(st.floats(0, 0.95)), reserved_bytes_per_s=draw(st.floats(0, 1e9)),
                      flows=tuple(draw(st.lists(st.floats(0, 1e10), max_size=4))), age_s=draw(st.floats(0, 20)))
             for i in range(n_links)]
    n = draw(st.integers(1, 40))
    sources = []
    for k in range(draw(st.integers(1, 5))):
        path = draw(st.lists(st.sampled_from([link.name for link in links]), min_size=1, max_size=3, unique=True))
        kind = draw(st.sampled_from(list(SourceKind)))
        warm = 10**6 if kind == UP else draw(st.integers(0, n))
        sources.append(Source(f"s{k}", kind, warm, tuple(path), alive=draw(st.booleans()) or k == 0, startup_s=draw(st.floats(0, 0.05))))
    if not any(s.warm_chunks >= n and s.alive for s in sources):
        sources[0] = Source("s0", UP, 10**6, sources[0].links)
    r = PathRequest(n, draw(st.floats(1, 1e9)), draw(st.integers(1, 80)), draw(st.integers(0, n)), draw(st.floats(0, 0.05)))
    return r, view(sources, links, stale_after_s=draw(st.sampled_from([1.0, 10.0, math.inf])))


@settings(max_examples=300, deadline=None)
@given(views())
def test_the_choice_covers_the_request_once_from_live_holders_and_beats_every_single_path(case):
    r, v = case
    c = choose_path(r, v)
    by_name = {s.name: s for s in v.sources}
    covered = r.first_chunk
    for seg in c.segments:  # contiguous, in order, each from a live source holding those chunks
        assert seg.first_chunk == covered and seg.end_chunk > seg.first_chunk
        assert by_name[seg.source].alive and by_name[seg.source].warm_chunks >= seg.end_chunk
        covered = seg.end_chunk
    assert covered == r.num_chunks
    singles = [choose_path(r, view([s], v.links.values(), v.stale_after_s), allow_split=False)
               for s in v.sources if s.alive and s.warm_chunks >= r.num_chunks]
    assert all(c.ttft_s <= s.ttft_s * (1 + 1e-9) + 1e-12 for s in singles)
    # No link moves this request's bytes faster than its pool; its rate there is at most the pool.
    for name, nbytes in c.link_bytes.items():
        pool = v.links[name].effective_bytes_per_s(v.stale_after_s)
        assert c.total_s >= nbytes / pool * (1 - 1e-9)
        assert c.link_rates.get(name, 0.0) <= pool * (1 + 1e-9)
    assert c.first_layer_s <= c.total_s * (1 + 1e-9) + 1e-12


def test_an_engine_busy_longer_than_either_path_takes_the_one_that_drains_first():
    links = [LinkView("fast", 10 * GB).with_flow(20 * GB), LinkView("slow", 2.5 * GB)]
    sources = [Source("a", UP, 10**6, ("fast",)), Source("b", UP, 10**6, ("slow",))]
    idle = choose_path(req(), view(sources, links), allow_split=False)
    busy = choose_path(PathRequest(10, 1e8, 32, engine_busy_s=5.0), view(sources, links), allow_split=False)
    assert idle.sources == ("a",)  # its fair share of the fast link (0.2 s) beats the idle slow one (0.4 s)
    # Both land before the engine is free: the tie goes to the link that empties first (0.4 s, not 2.1 s),
    # leaving the fast one's queue alone.
    assert busy.sources == ("b",) and busy.ttft_s == pytest.approx(5.0)
    assert busy.drain_s == pytest.approx(0.4) and idle.drain_s == pytest.approx(2.1)
