"""A peer granted an http kv-get dies before the engine reaches it: the kv-get still completes, through another path.

Node A (``direct_from_peers``) answers the engine's http kv-get with a ticket for a peer's data endpoint (B and C
both hold the prefix whole). Between A's grant and the engine's connect, the granted peer is killed: the connect
is refused, the SDK asks A again (a retry, no layer has moved), A no longer finds the dead peer and serves the
kv-get through the one left. The engine sees every layer once, byte-exact, with no upstream GET, and the kv-get's
stats name the peer it could not reach.
"""

from __future__ import annotations

import numpy as np
import pytest
from clustersupport import cluster_key, diagnose, start_nodes
from kvsupport import client, keys_for, make_chunks, reference, run, tiny_layout
from support import boto_client, make_tenants
from upstream import MotoServer, chunk_gets

from client_sdk import direct

LAYOUT = tiny_layout(16, num_layers=8)
N = 64


@pytest.fixture
def trio(tmp_path):
    moto = MotoServer(tmp_path / "moto.log").start()
    people = {t.name: t for t in make_tenants("alice")}
    try:
        nodes = start_nodes(tmp_path, moto, list(people.values()), cluster_key(),
                            {"a": {"direct_from_peers": True}, "b": {}, "c": {}})
        try:
            yield moto, nodes, people["alice"]
        finally:
            for n in nodes.values():
                n.kill()
    finally:
        moto.stop()


def test_a_granted_peer_that_died_before_the_engine_connected_costs_a_retry_not_the_kv_get(trio, monkeypatch):
    moto, nodes, alice = trio
    bucket = "grant-failover"
    boto_client(nodes["a"].endpoint, alice).create_bucket(Bucket=bucket)
    keys, chunks = keys_for(LAYOUT, N, bucket), make_chunks(LAYOUT, N, seed=31)

    async def put(node) -> None:
        async with client(node, alice, bucket) as c:
            assert await c.put_chunks(keys, chunks, LAYOUT) == N

    run(put(nodes["b"]))
    run(put(nodes["c"]))  # an identical re-put keeps a copy in C's cache too
    before = len(moto.requests())

    granted: list[str] = []
    real_open = direct.DirectFrameStream.open

    async def open_after_killing_the_first_peer(grant, descriptor, read_timeout):
        granted.append(grant.peer)
        if len(granted) == 1:
            assert grant.peer in ("b", "c"), grant  # A handed the kv-get to a peer
            nodes[grant.peer].kill()  # dead between A's grant and the engine's connect
        return await real_open(grant, descriptor, read_timeout)

    monkeypatch.setattr(direct.DirectFrameStream, "open", open_after_killing_the_first_peer)

    async def fetch():
        async with client(nodes["a"], alice, bucket) as c:
            async with c.fetch_layers(keys, LAYOUT, "http", mode="layerwise", verify=True) as layers:
                order = [i async for i, _ in layers]
                return np.frombuffer(layers.payload, np.uint8).reshape(LAYOUT.num_layers, -1).copy(), layers.stats, order

    try:
        payload, stats, order = run(fetch())
    except Exception as e:
        raise AssertionError(f"{type(e).__name__}: {e}; A's view: {diagnose(nodes['a'])}") from None
    victim = granted[0]
    assert order == list(range(LAYOUT.num_layers))
    assert np.array_equal(payload, reference(LAYOUT, chunks))
    assert stats.failovers == 1 and stats.broken_paths == {f"peer:{victim}": 0}, stats
    assert victim not in granted[1:], granted  # A did not hand it to the dead peer again
    assert f"peer:{victim}" not in stats.server.paths, stats.server
    assert chunk_gets(moto, bucket, before) == []  # the survivor's cache served it, not the upstream
