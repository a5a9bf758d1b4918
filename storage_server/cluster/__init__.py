"""Nodes that share their caches: membership, node-to-node calls under the cluster key, the peer load path.

* :mod:`.node` — wiring: the peer listener, membership, and the peer path as the chunk source's second source.
* :mod:`.membership` — static peers and heartbeat records in the upstream store.
* :mod:`.peer_server` / :mod:`.peer_client` — the two peer operations (:mod:`protocol.cluster`), both ends.
* :mod:`.direct_rdma` / :mod:`.part_writer` — peer -> engine over rdma: a kv-get written by peers (and this node) in parts.
* :mod:`.fetcher` — a kv-get's missing chunks from peers' caches, with failover and accounting.
* :mod:`.paths` — which peer first (pure; the cluster path scheduler replaces it).
"""

from .node import ClusterNode

__all__ = ["ClusterNode"]
