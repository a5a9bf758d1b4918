"""The capacity tier with compressed chunks: the upstream holds (and the link carries) the compressed objects,
the node that fetches them cold decodes them into raw layers — layer by layer while each chunk streams in
(``compression.decode_on_fetch``), into decoded copies the cold kv-get then reads."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from compressionsupport import kv_chunks, kv_layout
from kvsupport import client, keys_for, reference, rpc, run
from support import ServerProcess, boto_client, make_tenants
from upstream import MotoServer

from protocol.errors import ErrorCode, S3Error


def _node_config(root, name: str, moto: MotoServer, tenants) -> str:
    text = (f'[store]\nbackend = "s3"\ndata_dir = "{root / (name + "-data")}"\n{moto.config()}'
            f'[cache]\nfetch_concurrency = 4\n[storage_server]\nsocket = "{root / name}.sock"\n'
            '[compression]\nlossy_buckets = ["ztier-lossy"]\n')
    text += "".join(f'[[tenants]]\nname = "{t.name}"\naccess_key = "{t.access_key}"\nsecret_key = "{t.secret_key}"\n' for t in tenants)
    (root / f"{name}.toml").write_text(text)
    return root / f"{name}.toml"


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    root = tmp_path_factory.mktemp("ztier")
    moto = MotoServer(root / "moto.log").start()
    people = make_tenants("alice")
    nodes = [ServerProcess(_node_config(root, name, moto, people)).start() for name in ("a", "b")]
    for name, n in zip(("a", "b"), nodes):
        n.rpc_socket = str(root / f"{name}.sock")
    _first_cold_kv_get(nodes[0], nodes[1], people[0])
    yield moto, nodes[0], nodes[1], people[0]
    for n in nodes:
        n.stop()
    moto.stop()


@pytest.mark.parametrize("transport", ["shm", "http"])
def test_a_cold_node_fetches_compressed_chunks_from_the_upstream_and_delivers_raw_layers(tier, transport):
    moto, a, b, alice = tier
    bucket = f"ztier-{transport}"
    boto_client(a.endpoint, alice).create_bucket(Bucket=bucket)
    layout = kv_layout(64)
    n = 6
    chunks = kv_chunks(layout, n, seed=11)
    keys = keys_for(layout, n, bucket)

    async def go():
        async with client(a, alice, bucket) as ca:
            await ca.put_chunks(keys, chunks, layout, codec="zstd")
        before = len(moto.requests())
        async with client(b, alice, bucket) as cb:  # B never saw these chunks: every one comes from the upstream
            payload, stats = await cb.fetch(keys, layout, transport, verify=True)
        return payload, stats, moto.requests()[before:]

    streamed = _copies(b)["streamed"]
    decoded = _decoded_bytes(b)
    payload, stats, requests = run(go())
    assert np.array_equal(payload, reference(layout, chunks))
    # decoded as each chunk streamed in (B's decode pipeline did nothing after the fetch): the kv-get read the copies
    site = stats.server.decode_site
    assert site["decoded_copies"] == n and site["decoded_copies_read"] == "gathered", site
    assert _copies(b)["streamed"] == streamed + n and _decoded_bytes(b) == decoded
    gets = [r for r in requests if re.match(rf"GET /{bucket}/(?!\.objectcache)\S+ ", r)]
    assert len(gets) == n
    upstream_bytes = stats.server.paths.get("upstream", 0)
    sizes = [boto_client(a.endpoint, alice).head_object(Bucket=bucket, Key=k)["ContentLength"] for k in keys]
    assert upstream_bytes == sum(sizes) < n * layout.chunk_bytes  # the link carried the compressed bytes


def _first_cold_kv_get(a, b, alice) -> None:
    """B's first cold kv-get of a compressed chunk: it reserved no descriptors for copies when it arrived (B held none),
    but its pin made the copy as the chunk streamed in, so it takes a descriptor for it then and reads the copy: the
    chunk is decoded once, not again by the kv-get (nor by a fill after it)."""
    boto_client(a.endpoint, alice).create_bucket(Bucket="ztier-first")
    layout = kv_layout(16)
    chunks, keys = kv_chunks(layout, 1, seed=1), keys_for(layout, 1, "ztier-first")

    async def go():
        async with client(a, alice, "ztier-first") as ca:
            await ca.put_chunks(keys, chunks, layout, codec="zstd")
        async with client(b, alice, "ztier-first") as cb:
            return await cb.fetch(keys, layout, "shm", verify=True)
    decoded = _decoded_bytes(b)
    payload, stats = run(go())
    assert np.array_equal(payload, reference(layout, chunks))
    copies = _copies(b)
    assert copies["streamed"] == 1 and copies["chunks"] == 1 and copies["hits"] == 1, copies
    assert stats.server.decode_site["decoded_copies"] == 1, stats.server.decode_site
    assert _decoded_bytes(b) == decoded and copies["fills"] == 0 and copies["pending"] == 0, copies  # no second decode
    deadline = time.monotonic() + 30  # the kv-get's descriptors (the copy's too) given back once its END is sent
    while (fds := rpc(b.rpc_socket, "status")["transfer_fds"])["held_fds"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fds["held_fds"] == 0, fds
    assert fds["stream_decode_fds"] == 2 * 4  # a kv-get holds two for each chunk its pin may decode at once (fetch_concurrency)


def _copies(node) -> dict:
    return rpc(node.rpc_socket, "status")["decoded_copies"]


def _decoded_bytes(node) -> int:
    return int(rpc(node.rpc_socket, "status")["decode_pipeline"]["decompress"].get("bytes", 0))


def test_a_lossy_chunk_decoded_as_it_streamed_in_equals_the_sdks_decode_of_the_stored_bytes(tier):
    moto, a, b, alice = tier
    bucket = "ztier-lossy"
    boto_client(a.endpoint, alice).create_bucket(Bucket=bucket)
    layout = kv_layout(64)
    chunks, keys = kv_chunks(layout, 3, seed=12), keys_for(layout, 3, bucket)

    async def go():
        async with client(a, alice, bucket) as ca:
            await ca.put_chunks(keys, chunks, layout, codec="int4+zstd")
            by_sdk, _ = await ca.fetch(keys, layout, "http", verify=False, decode="client")
        async with client(b, alice, bucket) as cb:  # cold on B
            streamed, stats = await cb.fetch(keys, layout, "shm", verify=False)
        return by_sdk, streamed, stats
    by_sdk, streamed, stats = run(go())
    assert stats.server.decode_site["decoded_copies"] == 3, stats.server.decode_site
    assert np.array_equal(streamed, by_sdk)  # byte for byte the stored chunks' decode
    assert not np.array_equal(by_sdk, reference(layout, chunks))  # lossy indeed: the comparison is not vacuous


def test_a_corrupt_chunk_streaming_in_is_not_copied_and_the_kv_get_refuses_it_naming_the_key(tier):
    moto, a, b, alice = tier
    bucket = "ztier-corrupt"
    s3 = boto_client(a.endpoint, alice)
    s3.create_bucket(Bucket=bucket)
    layout = kv_layout(16)
    chunks, keys = kv_chunks(layout, 3, seed=13), keys_for(layout, 3, bucket)

    async def put():
        async with client(a, alice, bucket) as ca:
            await ca.put_chunks(keys, chunks, layout, codec="zstd")
    run(put())
    good = s3.get_object(Bucket=bucket, Key=keys[1])["Body"].read()
    bad_header, bad_payload = bytearray(good), bytearray(good)
    bad_header[28] ^= 0x01  # decoded_bytes
    bad_payload[-5] ^= 0xFF  # the last layer's bytes: its CRC no longer matches
    for bad, field in ((bad_header, "decoded_bytes"), (bad_payload, "layers[3].crc32c")):
        key = keys[1] + "-" + field.replace("[", "").replace("]", "")
        s3.put_object(Bucket=bucket, Key=key, Body=bytes(bad))  # plain S3: through A to the upstream, unchecked
        before = _copies(b)

        async def go(key=key):
            async with client(b, alice, bucket) as cb:
                return await cb.fetch([keys[0], key, keys[2]], layout, "shm", verify=True)
        with pytest.raises(S3Error) as e:
            run(go())
        assert e.value.code == ErrorCode.KVInvalidCompressedChunk, e.value
        assert key in e.value.message and field in e.value.message
        after = _copies(b)
        assert after["bytes"] <= after["max_bytes"] and after["streamed"] <= before["streamed"] + 2, after  # never the bad one


def test_the_node_a_kv_put_went_through_copies_its_compressed_chunks_and_its_first_kv_get_decodes_nothing(tier):
    """``compression.decode_on_put`` in a capacity tier: the chunks a kv-put wrote through the node's cache are decoded
    into copies right after the put, as on a local store, so the first kv-get through that node reads copies."""
    _, a, _, alice = tier
    bucket = "ztier-on-put"
    boto_client(a.endpoint, alice).create_bucket(Bucket=bucket)
    layout = kv_layout(64)
    n = 4
    chunks, keys = kv_chunks(layout, n, seed=61), keys_for(layout, n, bucket)
    prefills = _copies(a)["prefills"]

    async def put():
        async with client(a, alice, bucket) as ca:
            await ca.put_chunks(keys, chunks, layout, codec="zstd")
    run(put())
    deadline = time.monotonic() + 60
    while ((copies := _copies(a))["pending"] or copies["prefills"] < prefills + n) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert copies["prefills"] == prefills + n, copies  # decoded after the put, before any kv-get asked
    decoded = _decoded_bytes(a)

    async def fetch():
        async with client(a, alice, bucket) as ca:
            return await ca.fetch(keys, layout, "shm", verify=True)
    payload, stats = run(fetch())
    assert np.array_equal(payload, reference(layout, chunks))
    site = stats.server.decode_site
    assert site["decoded_copies"] == n and site["decoded_copies_read"] == "gathered", site
    assert stats.server.paths == {"local": stats.server.paths.get("local", 0)}  # the cache held them: nothing fetched
    assert _decoded_bytes(a) == decoded  # the first kv-get decoded nothing
