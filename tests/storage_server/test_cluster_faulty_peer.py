"""A peer that lies, answers garbage or stalls costs a bounded retry and never a wrong byte.

Node A (a real ``objectcache serve`` over moto) has one static peer: a fake in this test that
claims to hold every chunk and then misbehaves in one way per case. Every kv-get through A must
complete byte-exact from the upstream, and nothing the fake sent may stay in A's cache.
"""

from __future__ import annotations

import asyncio
import json
import threading

import numpy as np
import pytest
from clustersupport import cluster_key, start_node, status
from kvsupport import client, keys_for, make_chunks, reference, run, tiny_layout
from support import boto_client, free_port, make_tenants
from upstream import MotoServer

from protocol.cluster import CHUNK_HEAD, NOT_HELD
from protocol.rpc import encode_reply
from protocol.wire import decode_keys

LAYOUT = tiny_layout(16, num_layers=8)
CHUNK = LAYOUT.chunk_bytes


class FakePeer:
    """Answers every peer-lookup "all warm", and every peer-fetch according to ``behaviour``."""

    def __init__(self, port: int) -> None:
        self.port, self.behaviour, self.calls = port, "bad-crc", 0
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._listen(), self.loop).result(10)

    async def _listen(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = json.loads(await reader.readline())
        keys = decode_keys(await reader.readexactly(line["body"]))
        self.calls += 1
        if line["op"] == "peer-lookup":
            writer.write(encode_reply({"node_id": "liar", "warm": len(keys), "of": len(keys)}))
        elif self.behaviour == "garbage-reply":
            writer.write(b"\x00\xffnot json\n")
        else:
            writer.write(encode_reply({"node_id": "liar"}))
            start = line["start"]
            junk = bytes(range(256)) * (CHUNK // 256)
            if self.behaviour == "bad-crc":
                writer.write(CHUNK_HEAD.pack(start, CHUNK, 12345, 0) + junk)
            elif self.behaviour == "wrong-size":
                writer.write(CHUNK_HEAD.pack(start, CHUNK + 1, 0, 0) + junk + b"x")
            elif self.behaviour == "out-of-order":
                writer.write(CHUNK_HEAD.pack(start + 1, CHUNK, 0, 0) + junk)
            elif self.behaviour == "not-held":  # said it held everything, holds nothing
                writer.write(CHUNK_HEAD.pack(start, NOT_HELD, 0, 0))
            elif self.behaviour == "stall":
                await writer.drain()
                await asyncio.sleep(3)  # past the node's peer_timeout_s (1 s)
            elif self.behaviour == "hang-up":
                writer.write(CHUNK_HEAD.pack(start, CHUNK, 0, 0) + junk[:10])
        await writer.drain()
        writer.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture(scope="module")
def node_and_liar(tmp_path_factory):
    root = tmp_path_factory.mktemp("liar")
    moto = MotoServer(root / "moto.log").start()
    people = make_tenants("alice")
    fake = FakePeer(free_port())
    a = start_node(root, "a", moto, people, cluster_key(), peers={"liar": fake.port}, registry=False, peer_timeout_s=1.0)
    yield a, fake, people[0]
    a.stop()
    fake.stop()
    moto.stop()


@pytest.mark.parametrize("behaviour", ["bad-crc", "wrong-size", "out-of-order", "not-held", "garbage-reply", "stall", "hang-up"])
def test_a_misbehaving_peer_never_corrupts_a_kv_get_or_the_cache(node_and_liar, behaviour):
    a, fake, alice = node_and_liar
    fake.behaviour = behaviour
    bucket = f"liar-{behaviour}"
    boto_client(a.endpoint, alice).create_bucket(Bucket=bucket)
    n = 6
    keys, chunks = keys_for(LAYOUT, n, bucket), make_chunks(LAYOUT, n, seed=5)
    boto = boto_client(a.endpoint, alice)
    for k, ch in zip(keys, chunks):  # upstream only: A's cache is cold, the fake "holds" them all
        boto.put_object(Bucket=bucket, Key=k, Body=ch.tobytes())
    calls = fake.calls

    async def fetch():
        async with client(a, alice, bucket) as c:
            return await c.fetch(keys, LAYOUT, "http", mode="layerwise")

    payload, stats = run(fetch())
    assert fake.calls >= calls + 2  # it was asked, and streamed from
    assert np.array_equal(payload, reference(LAYOUT, chunks))
    assert stats.server.paths == {"upstream": n * CHUNK}
    if behaviour != "not-held":
        assert stats.server.failovers == 1
    payload, stats = run(fetch())  # what A's cache kept is the upstream's bytes
    assert np.array_equal(payload, reference(LAYOUT, chunks)) and stats.server.paths == {"local": n * CHUNK}
    assert status(a)["cluster"]["failovers"] >= 1


class _Unreachable:
    """An upstream nobody listens on."""

    def __init__(self) -> None:
        self.endpoint = f"http://127.0.0.1:{free_port()}"

    def config(self) -> str:
        return (f'[store.s3]\nendpoint_url = "{self.endpoint}"\naccess_key = "x"\nsecret_key = "y"\n'
                "max_attempts = 1\nconnect_timeout_s = 0.5\nread_timeout_s = 1\n")


def test_a_node_whose_upstream_registry_is_down_at_start_still_starts_and_keeps_trying(tmp_path):
    node = start_node(tmp_path, "lonely", _Unreachable(), make_tenants("t"), cluster_key())
    try:
        errors = status(node)["cluster"]
        assert errors["live_peers"] == [] and errors["node"]["node_id"] == "lonely"
    finally:
        node.stop()
