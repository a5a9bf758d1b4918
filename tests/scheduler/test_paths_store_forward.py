"""Store-and-forward sources (a node's fetch into its cache, a helper's relay): delivery waits for the fetch (pure)."""

from __future__ import annotations

import pytest

from scheduler import LinkView, OracleView, PathRequest, Source, SourceKind, choose_path
from scheduler.paths import fetch_phase, predict

GB = 1e9
ENG = LinkView("eng", 10 * GB)  # the node's link to its engine


def view(*sources: Source, links=()) -> OracleView:
    return OracleView(tuple(sources), {link.name: link for link in (ENG, *links)})


def test_delivery_of_every_chunk_starts_when_the_slowest_fetch_has_landed_after_its_fixed_cost():
    peer = Source("peer", SourceKind.PEER, 10, ("p", "eng"), startup_s=0.1, store_and_forward=True, deliver_s=0.05)
    local = Source("local", SourceKind.LOCAL, 4, ("eng",), startup_s=0.05)
    v = view(local, peer, links=[LinkView("p", 1 * GB)])
    c = predict(PathRequest(10, 1e8, 10), v, [("local", 0, 4), ("peer", 4, 10)])
    # The peer's 600 MB take 0.6 s after its 0.1 s; then 0.05 s; then all 1 GB over the engine link (first tenth: 0.01 s).
    by = {s.source: s for s in c.segments}
    assert by["peer"].fetched_s == pytest.approx(0.7) and by["local"].fetched_s == pytest.approx(0.05)
    assert c.first_layer_s == pytest.approx(0.7 + 0.05 + 0.01) and c.total_s == pytest.approx(0.7 + 0.05 + 0.1)
    assert by["local"].first_layer_s == pytest.approx(c.first_layer_s)  # the node's own chunks go out with the fetched ones
    assert fetch_phase(c, v) == (pytest.approx(0.7), "peer")
    alone = predict(PathRequest(10, 1e8, 10), v, [("local", 0, 4)])
    assert fetch_phase(alone, v) == (0.0, None) and alone.first_layer_s == pytest.approx(0.05 + 0.004)


def test_the_split_point_balances_the_fetches_not_the_delivery_they_share():
    a = Source("a", SourceKind.PEER, 10, ("la", "eng"), store_and_forward=True)
    b = Source("b", SourceKind.UPSTREAM, 10, ("lb", "eng"), store_and_forward=True)
    v = view(a, b, links=[LinkView("la", 3 * GB), LinkView("lb", 1 * GB)])
    c = choose_path(PathRequest(8, 1e8, 8), v)  # 3:1 by their links: both fetches end at 0.2 s
    assert [(s.source, s.end_chunk - s.first_chunk) for s in c.segments] == [("a", 6), ("b", 2)]
    assert c.first_layer_s == pytest.approx(0.2 + 0.01)


def test_a_relayed_share_is_fetched_then_forwarded_a_batch_at_a_time():
    relay = Source("h", SourceKind.UPSTREAM, 8, ("up", "hop", "eng"), store_and_forward=True, relay_at=1)
    links = [LinkView("up", 1 * GB), LinkView("hop", 2 * GB)]
    whole = predict(PathRequest(8, 1e8, 8), view(relay, links=links), [("h", 0, 8)])
    assert whole.segments[0].fetched_s == pytest.approx(0.8 + 0.4)  # never both links at once
    batched = Source("h", SourceKind.UPSTREAM, 8, ("up", "hop", "eng"), store_and_forward=True, relay_at=1, relay_batch_chunks=2)
    c = predict(PathRequest(8, 1e8, 8), view(batched, links=links), [("h", 0, 8)])
    assert c.segments[0].fetched_s == pytest.approx(0.8 + 0.1)  # the last batch's forwarding after all the GETs
    pipelined = Source("h", SourceKind.UPSTREAM, 8, ("up", "hop", "eng"), store_and_forward=True)
    assert predict(PathRequest(8, 1e8, 8), view(pipelined, links=links), [("h", 0, 8)]).segments[0].fetched_s == pytest.approx(0.8)
