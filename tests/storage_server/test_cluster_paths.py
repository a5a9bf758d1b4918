"""A node's path choices (scheduler.choose_path over its oracle view, as fetcher actions) and membership's liveness, pure."""

from __future__ import annotations

import pytest

from protocol.cluster import Heartbeat, NodeInfo
from protocol.config import ClusterConfig
from scheduler import PathRequest, choose_path
from scheduler.paths import peer_first
from storage_server.cluster.fetcher import split
from storage_server.cluster.membership import Membership, Seen
from storage_server.cluster.oracle_view import NodeLoad, TierMap, build_view
from storage_server.cluster.paths import Action, Move, actions, runs

ME = NodeInfo("a", "h:1", zone="z1", rack="r1", host="h1")
SAME_RACK = NodeInfo("b", "h:2", zone="z1", rack="r1", host="h2")
SAME_ZONE = NodeInfo("c", "h:3", zone="z1", rack="r2", host="h3")
FAR = NodeInfo("d", "h:4", zone="z2")
NODES = {n.node_id: n for n in (ME, SAME_RACK, SAME_ZONE, FAR)}
TIERS = TierMap.from_config(ClusterConfig())


def _choose(warm, n=40, chunk=1 << 20, layers=8, helpers=(), direct=False, gone=(), first=0, max_segments=2):
    view = build_view(ME, NODES, warm, n, TIERS, NodeLoad(), chunk_bytes=chunk, helpers=helpers, direct=direct, gone=gone)
    return actions(choose_path(PathRequest(n, chunk, layers, first_chunk=first), view, max_segments=max_segments), "a")


def share(moves: list[Action]) -> dict[str, int]:
    return {x.node: x.hi - x.lo for x in moves}


def test_peers_holding_everything_share_it_by_their_links_and_a_peer_gone_takes_none():
    # The same rack (100 Gbit/s) and the same zone (50) into a 200 Gbit/s engine link: split 2:1, the far one unused.
    assert share(_choose({"d": 40, "c": 40, "b": 40})) == {"b": 27, "c": 13}
    assert share(_choose({"d": 40, "c": 40, "b": 40}, max_segments=1)) == {"b": 40}
    # A peer that failed this kv-get is gone: the others take over.
    assert share(_choose({"d": 40, "c": 40, "b": 40}, gone={"b"})) == {"c": 27, "d": 13}


def test_a_warm_front_is_taken_from_a_peer_and_the_rest_from_the_upstream_at_once():
    got = _choose({"b": 10}, chunk=64 << 20)
    assert got[0] == Action(Move.PEER, "b", 0, 10) and got[1:] == [Action(Move.OWN, "a", 10, 40)]


def test_cold_chunks_are_shared_with_helpers_upstream_links_so_the_shares_finish_together():
    """Small chunks: each GET's first byte binds the upstream, so two nodes' GETs halve the time (DualPath's second path)."""
    alone = _choose({}, chunk=4096)
    assert alone == [Action(Move.OWN, "a", 0, 40)]
    two = _choose({"b": 0, "c": 0}, chunk=4096, helpers=("b", "c"))
    assert sorted((x.move.value, x.hi - x.lo) for x in two) == [("fill", 20), ("own", 20)]
    three = _choose({"b": 0, "c": 0}, chunk=4096, helpers=("b", "c"), max_segments=3)
    assert sorted(x.hi - x.lo for x in three) == [13, 13, 14] and {x.node for x in three} == {"a", "b", "c"}
    # A front from a peer's cache, then the cold rest split between this node's and a helper's links.
    mixed = _choose({"c": 10, "b": 0}, chunk=4096, helpers=("b",), max_segments=3)
    assert mixed[0] == Action(Move.PEER, "c", 0, 10) and sorted((x.move.value, x.hi - x.lo) for x in mixed[1:]) == [("fill", 15), ("own", 15)]


def test_a_peer_streams_straight_to_the_engine_only_when_it_serves_the_whole_kv_get():
    assert _choose({"b": 40}, direct=True) == [Action(Move.DIRECT, "b", 0, 40)]  # one hop fewer than through this node
    assert all(x.move is not Move.DIRECT for x in _choose({"b": 39}, direct=True))  # holds less: never part of a split
    # This node holds most of it: its cache and a short fetch beat the whole payload over the peer's link.
    assert all(x.move is not Move.DIRECT for x in _choose({"a": 35, "b": 40}, direct=True))
    # Holding only the head, it would fetch the rest and then deliver it all (store and forward): the peer streams it.
    assert _choose({"a": 5, "b": 40}, direct=True) == [Action(Move.DIRECT, "b", 0, 40)]


def test_runs_and_stream_ranges():
    assert runs([0, 1, 2, 5, 7, 8]) == [(0, 3), (5, 6), (7, 9)] and runs([]) == []
    assert split(3, 11, 3) == [(3, 5), (5, 8), (8, 11)] and split(0, 2, 8) == [(0, 1), (1, 2)]


def test_a_member_is_gone_after_its_record_stops_changing_for_the_missed_heartbeats():
    m = Membership(ClusterConfig(missed_heartbeats=3), ME, None)
    beat = Heartbeat(SAME_RACK, seq=5, sent_at=0.0, interval_s=1.0)
    m.seen["b"] = Seen(beat, changed_at=100.0)
    m.refreshed_at = 102.9
    assert m.live() == [SAME_RACK]
    m.refreshed_at = 103.1  # silent for more than 3 of its 1 s intervals, as of this node's last reading
    assert m.live() == []
    m2 = Membership(ClusterConfig(peers=("b=h:2", "a=h:1")), ME, None)
    assert m2.live() == [NodeInfo("b", "h:2")]  # static peers, never this node itself


def test_the_peer_first_baseline_takes_the_longest_warm_run_then_the_upstream_with_no_split():
    view = build_view(ME, NODES, {"b": 10, "c": 25, "d": 25}, 40, TIERS, NodeLoad(), chunk_bytes=4096, helpers=("b",))
    got = actions(peer_first(PathRequest(40, 4096, 8), view), "a")
    assert got == [Action(Move.PEER, "c", 0, 25), Action(Move.OWN, "a", 25, 40)]  # c: the nearer of the two longest
    whole = build_view(ME, NODES, {"b": 40}, 40, TIERS, NodeLoad(), direct=True)
    assert actions(peer_first(PathRequest(40, 4096, 8), whole), "a") == [Action(Move.DIRECT, "b", 0, 40)]


def test_a_store_shared_by_every_node_makes_splitting_a_cold_miss_over_nodes_gain_nothing():
    import dataclasses

    shared = dataclasses.replace(TIERS, store_streams=4)  # the store serves 4 GETs at once, as one node asks
    view = build_view(ME, NODES, {"b": 0, "c": 0}, 40, shared, NodeLoad(), chunk_bytes=4096, helpers=("b", "c"))
    assert view.links["upstream"].capacity_bytes_per_s == pytest.approx(shared.upstream_rate(4096))
    got = actions(choose_path(PathRequest(40, 4096, 8), view, max_segments=3), "a")
    assert got == [Action(Move.OWN, "a", 0, 40)]  # helpers' GETs would queue at the same store
