"""Which peer to ask first: a pure function of the lookup answers and the topology.

The simple rules until the cluster's path scheduler (issue 26) replaces them: for warm chunks, the peer holding the
longest warm run of the missing chunks first, a nearer one (same host, rack, zone) among equals,
then by node id so every node decides the same way. Peers holding nothing are left out. The
kv-get's node walks the list in order: when a peer fails part-way, the next one that holds
chunks past that point takes over, and whatever no peer brings comes from the upstream. For cold
chunks, with ``cluster.cold_split_peers`` = k, the miss is cut into k + 1 consecutive shares: the
first through this node's upstream link, the others through the k nearest peers' (DualPath's second
storage path), all at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.cluster import NodeInfo


@dataclass(frozen=True)
class Candidate:
    peer: NodeInfo
    warm: int  # leading missing chunks it said it holds


def rank_peers(me: NodeInfo, answers: list[Candidate]) -> list[Candidate]:
    """The peers worth asking, best first."""
    return sorted((a for a in answers if a.warm > 0), key=lambda a: (-a.warm, me.distance(a.peer), a.peer.node_id))


def cold_helpers(me: NodeInfo, peers: list[NodeInfo], k: int, exclude: set[str]) -> list[NodeInfo]:
    """Up to ``k`` peers to fetch shares of a cold miss from the upstream through their own links, nearest first."""
    usable = [p for p in peers if p.node_id not in exclude]
    return sorted(usable, key=lambda p: (me.distance(p), p.node_id))[:k]


def shares(indices: list[int], parts: int) -> list[list[int]]:
    """``indices`` cut into ``parts`` consecutive shares of near-equal length (the first is the asking node's own)."""
    n = len(indices)
    cuts = [n * i // parts for i in range(parts + 1)]
    return [indices[a:b] for a, b in zip(cuts, cuts[1:])]


def direct_peer(me: NodeInfo, answers: list[Candidate], n: int) -> NodeInfo | None:
    """The peer to stream a whole kv-get straight to the engine (peer -> engine): one holding all ``n`` chunks, nearest first."""
    whole = [a for a in rank_peers(me, answers) if a.warm == n]
    return whole[0].peer if whole else None
