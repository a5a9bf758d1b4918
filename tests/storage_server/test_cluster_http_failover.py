"""Failover inside the http peer -> engine stream: the peer streaming a kv-get to the engine dies mid-stream.

Node A (``direct_from_peers``) hands the engine's http kv-get to peer B's data endpoint (a ticket A obtained);
B and C hold the prefix whole; B serves slowly (``serve_max_bytes_per_s``: a layer in two seconds) and C does not
answer A's lookup (stopped) until B's stream has begun, so A hands the whole kv-get to B. B is killed once the engine holds two layers: the SDK closes B's stream and asks A again for
the layers from the third on (descriptor ``first_layer``), which A serves through another path. The engine sees
every layer once, in order, byte-exact (each layer's CRC32C checked), with no upstream GET.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from clustersupport import cluster_key, diagnose, start_node, status, wait_live
from kvsupport import client, keys_for, make_chunks, reference, run, tiny_layout
from support import boto_client, make_tenants
from upstream import MotoServer, chunk_gets

LAYOUT = tiny_layout(16, num_layers=8)  # S = 32 bytes, a chunk is 256 bytes
CHUNK = LAYOUT.chunk_bytes
N = 64  # a layer is 2 KiB


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("http-failover")
    moto = MotoServer(root / "moto.log").start()
    people = {t.name: t for t in make_tenants("alice")}
    key = cluster_key()
    nodes = {"a": start_node(root, "a", moto, list(people.values()), key, direct_from_peers=True),
             "b": start_node(root, "b", moto, list(people.values()), key, serve_max_bytes_per_s=N * CHUNK // LAYOUT.num_layers // 2),
             "c": start_node(root, "c", moto, list(people.values()), key)}
    try:
        wait_live(nodes["a"], {"b", "c"})
        yield moto, nodes, people
    finally:
        for n in nodes.values():
            n.kill()
        moto.stop()


async def _put(node, tenant, bucket, keys, chunks) -> None:
    async with client(node, tenant, bucket) as c:
        assert await c.put_chunks(keys, chunks, LAYOUT) == len(keys)


async def _fetch_killing(a, tenant, bucket, keys, victim, after_layers: int, begun):
    """The engine's http kv-get through A; ``begun`` awaited once the first layer is in, ``victim`` killed as soon
    as the engine holds ``after_layers`` layers."""
    async with client(a, tenant, bucket) as c:
        async with c.fetch_layers(keys, LAYOUT, "http", mode="layerwise", verify=True) as layers:
            order = []
            async for layer, _ in layers:
                order.append(layer)
                if len(order) == 1:
                    await begun()
                if len(order) == after_layers:
                    assert layers.stats.direct and layers.stats.failovers == 0, layers.stats  # still B's stream
                    victim.kill()
            return np.frombuffer(layers.payload, np.uint8).reshape(LAYOUT.num_layers, -1).copy(), layers.stats, order


def test_killing_the_peer_streaming_an_http_kv_get_completes_it_through_another_path(cluster):
    moto, nodes, people = cluster
    a, b, c = nodes["a"], nodes["b"], nodes["c"]
    bucket = "http-failover"
    boto_client(a.endpoint, people["alice"]).create_bucket(Bucket=bucket)
    keys, chunks = keys_for(LAYOUT, N, bucket), make_chunks(LAYOUT, N, seed=23)
    run(_put(b, people["alice"], bucket, keys, chunks))
    run(_put(c, people["alice"], bucket, keys, chunks))  # an identical re-put keeps a copy in C's cache
    before = len(moto.requests())
    # C is stopped while A looks its peers up (it cannot answer: B alone is offered the whole kv-get, one hop shorter
    # than a split through A) and resumed once B's stream has begun, before B dies.
    os.killpg(c.proc.pid, signal.SIGSTOP)

    async def resume_c() -> None:
        os.killpg(c.proc.pid, signal.SIGCONT)

    try:
        payload, stats, order = run(_fetch_killing(a, people["alice"], bucket, keys, b, 2, resume_c))
    except Exception as e:
        raise AssertionError(f"{type(e).__name__}: {e}; A's view: {diagnose(a)}") from None
    finally:
        os.killpg(c.proc.pid, signal.SIGCONT)
    assert order == list(range(LAYOUT.num_layers))  # every layer once, in order
    assert np.array_equal(payload, reference(LAYOUT, chunks))
    # B was killed with two layers handed out (a third may have been in the socket already); the rest came again.
    assert stats.failovers == 1 and 2 <= stats.broken_paths["peer:b"] < LAYOUT.num_layers and len(stats.broken_paths) == 1, stats
    paths = stats.server.paths  # what the resumed stream read: all of it from C's cache (directly, or through A's)
    assert "peer:b" not in paths and paths.get("peer:c", 0) == N * CHUNK == sum(paths.values()), (paths, diagnose(a))
    assert chunk_gets(moto, bucket, before) == []
    cluster_status = status(a)["cluster"]
    assert cluster_status["direct_resumed"] == 1 and cluster_status["direct_grants"] >= 1, cluster_status
