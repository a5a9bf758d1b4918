"""The cluster's path rules (storage_server.cluster.paths) and membership's liveness judgement, pure."""

from __future__ import annotations

from protocol.cluster import Heartbeat, NodeInfo
from protocol.config import ClusterConfig
from storage_server.cluster.fetcher import split
from storage_server.cluster.membership import Membership, Seen
from storage_server.cluster.paths import Candidate, cold_helpers, direct_peer, rank_peers, shares

ME = NodeInfo("a", "h:1", zone="z1", rack="r1", host="h1")
SAME_RACK = NodeInfo("b", "h:2", zone="z1", rack="r1", host="h2")
SAME_ZONE = NodeInfo("c", "h:3", zone="z1", rack="r2", host="h3")
FAR = NodeInfo("d", "h:4", zone="z2")


def test_the_longest_warm_run_first_then_the_nearest_then_the_id():
    answers = [Candidate(FAR, 10), Candidate(SAME_ZONE, 10), Candidate(SAME_RACK, 4), Candidate(NodeInfo("e", "h:5"), 0)]
    assert [c.peer.node_id for c in rank_peers(ME, answers)] == ["c", "d", "b"]  # e holds nothing: not asked
    assert direct_peer(ME, answers, 10) == SAME_ZONE and direct_peer(ME, answers, 11) is None


def test_cold_shares_and_helpers():
    assert shares(list(range(10)), 2) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert shares([1, 2, 3], 3) == [[1], [2], [3]] and sum(shares(list(range(7)), 3), []) == list(range(7))
    assert cold_helpers(ME, [FAR, SAME_ZONE, SAME_RACK], 2, exclude={"b"}) == [SAME_ZONE, FAR]
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
