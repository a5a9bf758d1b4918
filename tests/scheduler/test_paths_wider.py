"""The path scheduler beyond two-way splits (pure): shares among several full sources, whole-only sources, a peer gone mid-plan."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import LinkView, OracleView, PathRequest, Source, SourceKind, choose_path

GB = 1e9
UP, PEER = SourceKind.UPSTREAM, SourceKind.PEER


def view(sources, links) -> OracleView:
    return OracleView(tuple(sources), {link.name: link for link in links})


def test_three_equal_disjoint_paths_share_the_request_in_thirds_when_allowed():
    links = [LinkView(x, 1 * GB) for x in "abc"]
    sources = [Source(f"up{x}", UP, 10**6, (x,)) for x in "abc"]
    r = PathRequest(30, 1e8, 8)
    two = choose_path(r, view(sources, links))
    three = choose_path(r, view(sources, links), max_segments=3)
    assert len(two.segments) == 2 and two.total_s == pytest.approx(1.5)
    assert [s.end_chunk - s.first_chunk for s in three.segments] == [10, 10, 10] and three.total_s == pytest.approx(1.0)


def test_shares_follow_the_rates_and_a_late_starter_gets_less():
    links = [LinkView("fast", 2 * GB), LinkView("slow", 1 * GB), LinkView("late", 1 * GB)]
    sources = [Source("fast", UP, 10**6, ("fast",)), Source("slow", UP, 10**6, ("slow",)),
               Source("late", UP, 10**6, ("late",), startup_s=0.5)]
    c = choose_path(PathRequest(40, 1e8, 8), view(sources, links), max_segments=3)
    got = {s.source: s.end_chunk - s.first_chunk for s in c.segments}
    # T solves 20t + 10t + 10(t - 0.5) = 40: t = 1.125 -> 22.5, 11.25, 6.25 chunks.
    assert got == {"fast": 22, "slow": 11, "late": 7} or got == {"fast": 23, "slow": 11, "late": 6}
    assert c.total_s == pytest.approx(1.15, abs=0.05)
    # Starting after the others would have finished, it gets nothing.
    sources[2] = Source("late", UP, 10**6, ("late",), startup_s=5.0)
    assert "late" not in choose_path(PathRequest(40, 1e8, 8), view(sources, links), max_segments=3).sources


def test_a_wider_split_is_taken_only_when_it_is_faster():
    # Every source behind one shared bottleneck: sharing the request gains nothing, one path wins (fewer segments).
    links = [LinkView("a", 10 * GB), LinkView("b", 10 * GB), LinkView("c", 10 * GB), LinkView("nic", 1 * GB)]
    sources = [Source(x, UP, 10**6, (x, "nic")) for x in "abc"]
    c = choose_path(PathRequest(30, 1e8, 8), view(sources, links), max_segments=3)
    assert len(c.segments) == 1


def test_a_whole_only_source_serves_all_or_nothing():
    links = [LinkView("direct", 1 * GB), LinkView("up", 1 * GB)]
    sources = [Source("direct:b", PEER, 10, ("direct",), whole_only=True), Source("upstream@a", UP, 10**6, ("up",))]
    c = choose_path(PathRequest(10, 1e8, 8), view(sources, links), max_segments=3)
    assert len(c.segments) == 1  # a split would halve the time, but the direct peer cannot take half
    # Holding less than all of it, it is no source at all.
    short = [Source("direct:b", PEER, 9, ("direct",), whole_only=True), sources[1]]
    assert choose_path(PathRequest(10, 1e8, 8), view(short, links), max_segments=3).sources == ("upstream@a",)


def test_a_front_then_a_shared_back():
    links = [LinkView("peer", 100 * GB), LinkView("u1", 1 * GB), LinkView("u2", 1 * GB)]
    sources = [Source("peer:b", PEER, 10, ("peer",)), Source("u1", UP, 10**6, ("u1",)), Source("u2", UP, 10**6, ("u2",))]
    c = choose_path(PathRequest(30, 1e8, 8), view(sources, links), max_segments=3)
    assert [(s.source, s.first_chunk) for s in c.segments][0] == ("peer:b", 0)
    assert sorted(s.end_chunk - s.first_chunk for s in c.segments[1:]) == [10, 10]
    # The peer gone: the upstream links share all of it.
    gone = [Source("peer:b", PEER, 10, ("peer",), alive=False), *sources[1:]]
    assert sorted(s.end_chunk - s.first_chunk for s in choose_path(PathRequest(30, 1e8, 8), view(gone, links), max_segments=3).segments) == [15, 15]


@st.composite
def views(draw):
    links = [LinkView(f"l{i}", draw(st.floats(1e6, 1e11)), latency_s=draw(st.floats(0, 0.01)),
                      flows=tuple(draw(st.lists(st.floats(0, 1e10), max_size=3)))) for i in range(draw(st.integers(1, 5)))]
    n = draw(st.integers(1, 60))
    sources = []
    for k in range(draw(st.integers(1, 6))):
        path = draw(st.lists(st.sampled_from([link.name for link in links]), min_size=1, max_size=3, unique=True))
        kind = draw(st.sampled_from(list(SourceKind)))
        warm = 10**6 if kind == UP else draw(st.integers(0, n))
        sources.append(Source(f"s{k}", kind, warm, tuple(path), alive=draw(st.booleans()) or k == 0,
                              startup_s=draw(st.floats(0, 0.05)), whole_only=draw(st.booleans()) and k > 0))
    if not any(s.warm_chunks >= n and s.alive for s in sources):
        sources[0] = Source("s0", UP, 10**6, sources[0].links)
    r = PathRequest(n, draw(st.floats(1, 1e9)), draw(st.integers(1, 80)), draw(st.integers(0, n)))
    return r, view(sources, links), draw(st.integers(2, 5))


@settings(max_examples=200, deadline=None)
@given(views())
def test_a_wider_choice_covers_the_request_once_within_its_limit_and_never_loses_to_two_segments(case):
    r, v, k = case
    c = choose_path(r, v, max_segments=k)
    by_name = {s.name: s for s in v.sources}
    covered = r.first_chunk
    for seg in c.segments:
        src = by_name[seg.source]
        assert seg.first_chunk == covered and src.alive and src.warm_chunks >= seg.end_chunk
        assert not src.whole_only or (seg.first_chunk, seg.end_chunk) == (r.first_chunk, r.num_chunks)
        covered = seg.end_chunk
    assert covered == r.num_chunks and len(c.segments) <= k
    assert c.ttft_s <= choose_path(r, v).ttft_s * (1 + 1e-9) + 1e-12
    assert math.isfinite(c.total_s)
