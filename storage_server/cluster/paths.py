"""Which peer to ask first: a pure function of the lookup answers and the topology.

The simple rule until the cluster's path scheduler (issue 26) replaces it: the peer holding the
longest warm run of the missing chunks first, a nearer one (same host, rack, zone) among equals,
then by node id so every node decides the same way. Peers holding nothing are left out. The
kv-get's node walks the list in order: when a peer fails part-way, the next one that holds
chunks past that point takes over, and whatever no peer brings comes from the upstream.
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
