"""Nodes share their caches: three real nodes on loopback over one moto upstream.

A kv-get arriving at node A fetches the chunks A misses from a peer's cache (node to node, under
the cluster key and a grant A signs for the tenant's request) instead of the upstream; moto's
request log counts the upstream GETs that saves. A peer killed mid-stream is replaced by another
path within the same kv-get; nothing a tenant holds opens a peer path.
"""

from __future__ import annotations

import asyncio
import json
import threading

import numpy as np
import pytest
from clustersupport import cluster_key, diagnose, start_node, start_trio, status, wait_for, wait_live
from kvsupport import TRANSPORTS, client, keys_for, make_chunks, reference, run, tiny_layout
from support import boto_client, make_tenants
from upstream import MotoServer, chunk_gets

from protocol.cluster_auth import PeerGrant, sign_call
from protocol.rpc import Op, RpcRequest
from protocol.wire import encode_keys

LAYOUT = tiny_layout(16, num_layers=8)  # S = 32 bytes, a chunk is 256 bytes
CHUNK = LAYOUT.chunk_bytes


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """moto + nodes a, b, c finding each other through heartbeat records in the upstream; tenants alice and bob."""
    root = tmp_path_factory.mktemp("cluster")
    moto = MotoServer(root / "moto.log").start()
    people = make_tenants("alice", "bob")
    key = cluster_key()
    # A splits what no peer holds with one peer's upstream link (cluster.cold_split_peers).
    nodes = start_trio(root, moto, people, key, cold_split_peers=1)
    yield moto, nodes, {t.name: t for t in people}, key, root
    for n in nodes.values():
        n.stop()
    moto.stop()


async def _put(node, tenant, bucket, keys, chunks, layout=LAYOUT) -> None:
    async with client(node, tenant, bucket) as c:
        assert await c.put_chunks(keys, chunks, layout) == len(keys)


async def _fetch(node, tenant, bucket, keys, transport="http", layout=LAYOUT):
    async with client(node, tenant, bucket) as c:
        return await c.fetch(keys, layout, transport, mode="layerwise")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_prefix_warm_only_on_b_is_fetched_through_a_from_b_with_no_upstream_get(cluster, transport):
    moto, nodes, people, _, _ = cluster
    a, b = nodes["a"], nodes["b"]
    bucket = f"warm-on-b-{transport}"
    boto_client(a.endpoint, people["alice"]).create_bucket(Bucket=bucket)
    n = 40
    keys, chunks = keys_for(LAYOUT, n, bucket), make_chunks(LAYOUT, n, seed=7)
    boto = boto_client(a.endpoint, people["alice"])
    for k, ch in zip(keys, chunks):  # put through A (plain S3 PUTs: no cache keeps a copy)
        boto.put_object(Bucket=bucket, Key=k, Body=ch.tobytes())
    _, stats = run(_fetch(b, people["alice"], bucket, keys, transport))  # now warm on B only (B had no peer to ask)
    assert stats.server.paths == {"upstream": n * CHUNK}
    served = status(b)["cluster"]["served"]["bytes"]
    wait_live(a, {"b"})
    before = len(moto.requests())
    payload, stats = run(_fetch(a, people["alice"], bucket, keys, transport))
    assert np.array_equal(payload, reference(LAYOUT, chunks))
    assert stats.server.paths == {"peer:b": n * CHUNK} and stats.server.failovers == 0, (stats.server, diagnose(a))
    assert chunk_gets(moto, bucket, before) == []  # not one chunk from the upstream
    assert status(b)["cluster"]["served"]["bytes"] - served == n * CHUNK
    # Received straight into the kv-get's memory (cut-through), and written through A's cache beside the delivery, as
    # an upstream fetch would be: the next kv-get is local (it waits for any chunk still being written).
    cache = status(a)["chunk_cache"]
    assert cache["arrived"] >= n, cache
    payload, stats = run(_fetch(a, people["alice"], bucket, keys, transport))
    assert np.array_equal(payload, reference(LAYOUT, chunks)) and stats.server.paths == {"local": n * CHUNK}
    assert status(a)["chunk_cache"]["arrived_cached"] - cache["arrived_cached"] <= n


@pytest.mark.parametrize("g", [16, 64, 256])
def test_a_split_kv_get_is_served_by_the_cache_a_peer_and_two_nodes_upstream_links_at_once(cluster, g):
    """A holds the head, C the middle, nobody the tail: the tail is split between A's upstream link and a peer's (B's,
    or C's beside the middle it streams from its cache: the path scheduler picks by what it has learnt of each)."""
    moto, nodes, people, _, _ = cluster
    a, c = nodes["a"], nodes["c"]
    layout = tiny_layout(g, num_layers=8)
    chunk = layout.chunk_bytes
    bucket = f"split-{g}"
    boto = boto_client(a.endpoint, people["alice"])
    boto.create_bucket(Bucket=bucket)
    n = 40
    keys, chunks = keys_for(layout, n, bucket), make_chunks(layout, n, seed=g)
    for k, ch in zip(keys, chunks):  # in the upstream only (plain S3 PUTs keep no cache copy)
        boto.put_object(Bucket=bucket, Key=k, Body=ch.tobytes())
    run(_put(c, people["alice"], bucket, keys[:20], chunks[:20], layout))  # an identical re-put: warm on C
    run(_fetch(a, people["alice"], bucket, keys[:10], layout=layout))  # A holds the head (from C)
    before = len(moto.requests())
    payload, stats = run(_fetch(a, people["alice"], bucket, keys, layout=layout))
    assert np.array_equal(payload, reference(layout, chunks))
    paths = stats.server.paths
    assert paths["local"] == 10 * chunk and paths.get("peer:c", 0) >= 10 * chunk, paths  # the middle: only C holds it
    # The cold rest shared by A's upstream link and the peers' as the path scheduler balanced them (a peer's share also
    # pays a peer stream's learnt fixed cost): A's link and a peer's each carry some, together all of it.
    by_peers = paths.get("peer:b", 0) + paths["peer:c"] - 10 * chunk
    assert paths["upstream"] > 0 and by_peers > 0 and paths["upstream"] + by_peers == 20 * chunk, paths
    assert sum(paths.values()) == n * chunk, paths
    assert len(chunk_gets(moto, bucket, before)) == 20  # every cold chunk fetched once (C's middle came from its cache)


def test_killing_the_serving_peer_mid_transfer_completes_the_kv_get_through_another_path(cluster, tmp_path):
    moto, nodes, people, key, _ = cluster
    # A slow peer (its serving rate capped) and C, both warm; the kv-get arrives at a fresh node E. E has learnt no
    # fixed cost for either peer (the module's node A has, from the tests before, and then may take it all from C), so
    # both predict alike and the tie goes to "b0" by name (or both share the prefix): the slow peer serves part of it.
    slow = start_node(tmp_path, "b0", moto, list(people.values()), key, serve_max_bytes_per_s=8 * CHUNK)
    e = start_node(tmp_path, "e", moto, list(people.values()), key)
    try:
        wait_live(e, {"b0", "c"})
        bucket = "failover"
        boto_client(e.endpoint, people["alice"]).create_bucket(Bucket=bucket)
        n = 64
        keys, chunks = keys_for(LAYOUT, n, bucket), make_chunks(LAYOUT, n, seed=11)
        run(_put(slow, people["alice"], bucket, keys, chunks))
        run(_put(nodes["c"], people["alice"], bucket, keys, chunks))  # an identical re-put keeps a copy in C's cache
        before = len(moto.requests())
        result: dict = {}

        def fetch() -> None:
            try:
                result["out"] = run(_fetch(e, people["alice"], bucket, keys))
            except BaseException as err:  # noqa: BLE001 - reported by the main thread
                result["error"] = err

        t = threading.Thread(target=fetch)
        t.start()
        wait_for(lambda: status(slow)["cluster"]["served"]["chunks"] >= 2 or not t.is_alive(), what="the slow peer streaming")
        assert t.is_alive(), f"the kv-get ended before the slow peer served two chunks: {result}"
        slow.kill()  # mid-transfer: its streams break
        t.join(60)
        assert "error" not in result, result
        payload, stats = result["out"]
        assert np.array_equal(payload, reference(LAYOUT, chunks))
        paths = stats.server.paths
        assert paths.get("peer:b0", 0) > 0 and paths.get("peer:c", 0) > 0 and sum(paths.values()) == n * CHUNK
        assert stats.server.failovers >= 1 and chunk_gets(moto, bucket, before) == []
        assert status(e)["cluster"]["failovers"] >= 1
    finally:
        slow.kill()
        e.stop()


def test_a_peer_streams_a_kv_get_straight_to_the_engine_with_a_ticket_the_first_node_obtained(cluster, tmp_path):
    """Peer -> engine over the direct http data path: D lacks the prefix, B holds it whole, the client streams from B."""
    moto, nodes, people, key, _ = cluster
    b = nodes["b"]
    d = start_node(tmp_path, "d", moto, list(people.values()), key, direct_from_peers=True)
    try:
        wait_live(d, {"b"})
        bucket = "direct"
        boto_client(d.endpoint, people["alice"]).create_bucket(Bucket=bucket)
        n = 24
        keys, chunks = keys_for(LAYOUT, n, bucket), make_chunks(LAYOUT, n, seed=17)
        run(_put(b, people["alice"], bucket, keys, chunks))
        tickets, before = status(b)["cluster"]["served"]["tickets"], len(moto.requests())
        payload, stats = run(_fetch(d, people["alice"], bucket, keys, "http"))
        assert np.array_equal(payload, reference(LAYOUT, chunks)) and chunk_gets(moto, bucket, before) == []
        assert stats.direct and stats.server.paths == {"peer:b": n * CHUNK}
        assert status(b)["cluster"]["served"]["tickets"] == tickets + 1 and status(d)["cluster"]["direct_grants"] == 1
        assert status(d)["chunk_cache"]["chunks"] == 0  # the bytes went B -> engine, not through D's cache
        payload, stats = run(_fetch(d, people["alice"], bucket, keys, "shm"))  # shm is host-local: through D's cache
        assert np.array_equal(payload, reference(LAYOUT, chunks)) and stats.server.paths == {"peer:b": n * CHUNK}
    finally:
        d.stop()


def test_bob_cannot_use_alices_chunks_through_any_peer_path(cluster):
    moto, nodes, people, _, _ = cluster
    a, b = nodes["a"], nodes["b"]
    bucket = "alices-kv"
    boto_client(a.endpoint, people["alice"]).create_bucket(Bucket=bucket)
    n = 8
    keys, chunks = keys_for(LAYOUT, n, bucket), make_chunks(LAYOUT, n, seed=13)
    run(_put(b, people["alice"], bucket, keys, chunks))  # warm on B
    served = status(b)["cluster"]["served"]
    with pytest.raises(Exception, match="AccessDenied"):
        run(_fetch(a, people["bob"], bucket, keys))  # refused at A's gateway: no grant, no peer call
    # Bob's own bucket asking for the very same keys: grants name his bucket's incarnation, whose chunks nobody holds.
    boto_client(a.endpoint, people["bob"]).create_bucket(Bucket="bobs-kv")
    with pytest.raises(Exception, match="NoSuchKey"):
        run(_fetch(a, people["bob"], "bobs-kv", keys))
    after = status(b)["cluster"]["served"]
    assert after["bytes"] == served["bytes"] and after["chunks"] == served["chunks"]


def _peer_call(port: int, op: Op, fields: dict, body: bytes) -> dict:
    async def go():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(RpcRequest(op, fields, len(body)).encode() + body)
        line = await reader.readline()
        writer.close()
        return json.loads(line)

    return run(go())


def test_a_peer_call_without_the_cluster_key_is_refused(cluster):
    _, nodes, people, key, _ = cluster
    b = nodes["b"]
    bucket = "alices-kv"  # from the test above when run together; any bucket will do for refusals
    keys = keys_for(LAYOUT, 4, bucket)
    body = encode_keys(keys)
    fields = {"bucket": bucket, "bucket_id": "x", "start": 0, "count": 4}
    port = b.peer_port
    refused = status(b)["cluster"]["served"]["refused"]
    # No signature at all (what a tenant could send).
    reply = _peer_call(port, Op.PEER_FETCH, fields, body)
    assert not reply["ok"] and reply["error"]["code"] == "AccessDenied"
    # Signed with another key, grant included.
    wrong = b"w" * 40
    grant = PeerGrant.issue(wrong, tenant="bob", bucket=bucket, bucket_id="x", keys=keys, request_id="r", issuer="mallory", ttl_s=30)
    reply = _peer_call(port, Op.PEER_FETCH, sign_call(wrong, "mallory", Op.PEER_FETCH.value, {**fields, "grant": grant}, body), body)
    assert not reply["ok"] and "signature" in reply["error"]["message"]
    # The right key but the grant signed with another (or none): still refused.
    k = key.encode()
    reply = _peer_call(port, Op.PEER_LOOKUP, sign_call(k, "a", Op.PEER_LOOKUP.value, {**fields, "grant": grant}, body), body)
    assert not reply["ok"] and "grant" in reply["error"]["message"]
    # A correct call replayed is refused the second time; a grant for other keys is refused.
    good = PeerGrant.issue(k, tenant="alice", bucket=bucket, bucket_id="x", keys=keys, request_id="r", issuer="a", ttl_s=30)
    signed = sign_call(k, "a", Op.PEER_LOOKUP.value, {**fields, "grant": good}, body)
    assert _peer_call(port, Op.PEER_LOOKUP, signed, body)["ok"]
    reply = _peer_call(port, Op.PEER_LOOKUP, signed, body)
    assert not reply["ok"] and "replayed" in reply["error"]["message"]
    other = encode_keys(keys[:3])
    reply = _peer_call(port, Op.PEER_LOOKUP, sign_call(k, "a", Op.PEER_LOOKUP.value, {**fields, "grant": good}, other), other)
    assert not reply["ok"] and "keys" in reply["error"]["message"]
    # A ticket for B's data endpoint (peer -> engine) needs the key too.
    reply = _peer_call(port, Op.PEER_TICKET, {"bucket": bucket, "bucket_id": "x", "grant": good}, b"descriptor")
    assert not reply["ok"] and reply["error"]["code"] == "AccessDenied"
    # Tenant operations are not served on the peer listener at all.
    reply = _peer_call(port, Op.KV_GET, {"tenant": "alice", "bucket": bucket}, b"")
    assert not reply["ok"] and "not served" in reply["error"]["message"]
    assert status(b)["cluster"]["served"]["refused"] >= refused + 6
