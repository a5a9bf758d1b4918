"""Compressed chunks between cluster nodes: a peer serves them as stored (fewer bytes on the peer link), the node
that asked decodes them into the engine's memory."""

from __future__ import annotations

import numpy as np
import pytest
from clustersupport import cluster_key, diagnose, start_nodes, wait_live
from compressionsupport import kv_chunks, kv_layout
from kvsupport import client, keys_for, reference, run
from support import boto_client, make_tenants
from upstream import MotoServer

from client_sdk.compression import encode_layout_chunk


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("zcluster")
    moto = MotoServer(root / "moto.log").start()
    people = make_tenants("alice")
    key = cluster_key()
    nodes = start_nodes(root, moto, people, key, {"a": {}, "b": {}})
    yield moto, nodes, people[0]
    for n in nodes.values():
        n.stop()
    moto.stop()


@pytest.mark.parametrize("transport", ["shm", "http"])
def test_a_peer_serves_compressed_chunks_and_the_asking_node_decodes_them(pair, transport):
    moto, nodes, alice = pair
    a, b = nodes["a"], nodes["b"]
    bucket = f"zpeer-{transport}"
    boto = boto_client(a.endpoint, alice)
    boto.create_bucket(Bucket=bucket)
    layout = kv_layout(64)
    n = 8
    chunks = kv_chunks(layout, n, seed=51)
    keys = keys_for(layout, n, bucket)
    stored = [encode_layout_chunk(memoryview(ch), layout, "zstd") for ch in chunks]
    for k, obj in zip(keys, stored):  # plain S3 PUTs through A: no cache keeps a copy
        boto.put_object(Bucket=bucket, Key=k, Body=obj)

    async def fetch(node):
        async with client(node, alice, bucket) as c:
            return await c.fetch(keys, layout, transport, mode="layerwise")

    payload, stats = run(fetch(b))  # warm on B only
    assert np.array_equal(payload, reference(layout, chunks))
    assert stats.server.paths == {"upstream": sum(map(len, stored))}
    wait_live(a, {"b"})
    payload, stats = run(fetch(a))
    assert np.array_equal(payload, reference(layout, chunks))
    assert stats.server.paths == {"peer:b": sum(map(len, stored))} and stats.server.failovers == 0, (stats.server, diagnose(a))
