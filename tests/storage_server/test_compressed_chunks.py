"""Compressed chunks through a real node: stored compressed, decoded in the node, delivered raw over every transport.

One ``objectcache serve`` whose ``[compression]`` allows lossy codecs in one bucket only; a second
node pair over moto shows the capacity tier fetching compressed objects from the upstream.
"""

from __future__ import annotations

import numpy as np
import pytest
from botocore.exceptions import ClientError
from compressionsupport import kv_chunks, kv_layout
from kvsupport import TRANSPORTS, client, keys_for, reference, rpc, run
from support import ServerProcess, boto_client, make_tenants, write_config

from client_sdk.compression import shape_header
from protocol.codecs import group_absmax
from protocol.codecs.base import to_float32
from protocol.errors import ErrorCode, S3Error


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("compressed")
    people = make_tenants("alice")
    config = write_config(root / "c.toml", root / "data", people,
                          extra=f'\n[storage_server]\nsocket = "{root / "ss.sock"}"\ndata_listen = "127.0.0.1:0"\n[compression]\nlossy_buckets = ["lossy"]\nbucket_codecs = ["auto:zstd", "lossy:int8"]\n'
                                '# several pieces per layer through the decode stages, one worker each\n'
                                'piece_bytes = 4096\ndecompress_threads = 1\ndequantise_threads = 1\n'
                                '# every kv-get here decodes in the node (no copies made after the kv-puts)\ndecode_on_put = false\n')
    proc = ServerProcess(config).start()
    proc.rpc_socket = str(root / "ss.sock")
    s3 = boto_client(proc.endpoint, people[0])
    for bucket in ("kvz", "lossy", "strict", "auto"):
        s3.create_bucket(Bucket=bucket)
    yield proc, people[0], s3
    proc.stop()


def _put_and_fetch(proc, tenant, bucket, layout, chunks, keys, codec, transport):
    async def go():
        async with client(proc, tenant, bucket) as c:
            await c.put_chunks(keys, chunks, layout, codec=codec)
            return await c.fetch(keys, layout, transport, verify=True)
    return run(go())


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("chunk_tokens", [16, 64, 256])
def test_lossless_chunks_are_byte_exact_after_node_decode(node, transport, chunk_tokens):
    proc, alice, s3 = node
    layout = kv_layout(chunk_tokens)
    n = 6
    chunks = kv_chunks(layout, n, seed=chunk_tokens)
    keys = keys_for(layout, n, f"zstd-{transport}-{chunk_tokens}")
    before = rpc(proc.rpc_socket, "status")["decode_pipeline"]["decompress"]["pieces"]
    payload, stats = _put_and_fetch(proc, alice, "kvz", layout, chunks, keys, "zstd", transport)
    assert np.array_equal(payload, reference(layout, chunks))
    assert rpc(proc.rpc_socket, "status")["decode_pipeline"]["decompress"]["pieces"] > before  # decoded by the node's pipeline
    stored = s3.head_object(Bucket="kvz", Key=keys[0])["ContentLength"]
    assert stored < layout.chunk_bytes  # stored compressed: an ordinary object of its own size
    listed = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket="kvz", Prefix=keys[0])["Contents"]}
    assert listed[keys[0]] == stored


@pytest.mark.parametrize("transport", ["shm", "http"])
def test_mixed_raw_and_compressed_chunks_in_one_kv_get(node, transport):
    proc, alice, _ = node
    layout = kv_layout(16)
    chunks = kv_chunks(layout, 8, seed=5)
    keys = keys_for(layout, 8, f"mixed-{transport}")

    async def go():
        async with client(proc, alice, "kvz") as c:
            await c.put_chunks(keys[:3], chunks[:3], layout)
            await c.put_chunks(keys[3:], chunks[3:], layout, codec="zstd")
            return await c.fetch(keys, layout, transport, mode="chunkwise" if transport == "http" else "layerwise")
    payload, _ = run(go())
    assert np.array_equal(payload, reference(layout, chunks))


def test_int8_chunks_decode_within_the_bound_in_an_allowed_bucket(node):
    proc, alice, _ = node
    layout = kv_layout(16)
    chunks = kv_chunks(layout, 4, seed=7)
    keys = keys_for(layout, 4, "int8")
    payload, _ = _put_and_fetch(proc, alice, "lossy", layout, chunks, keys, "int8+zstd", "shm")
    expected = reference(layout, chunks)
    s, shape = layout.per_layer_chunk_bytes, (2, layout.chunk_tokens, layout.kv_heads * layout.head_dim)
    from protocol.codecs import SliceLayout, codec_by_name

    codec, sl = codec_by_name("int8+zstd"), SliceLayout(*shape)
    assert not np.array_equal(payload, expected)  # lossy: not the same bytes ...
    for layer in range(layout.num_layers):
        for j in range(4):
            x = to_float32(expected[layer, j * s : (j + 1) * s].copy(), "bfloat16")
            y = to_float32(payload[layer, j * s : (j + 1) * s].copy(), "bfloat16")
            bounds = np.array([codec.max_abs_error(a, "bfloat16") for a in group_absmax(x, sl)])
            err = np.abs(y - x).reshape(shape)
            assert (err[0] <= bounds[: shape[2]][None, :]).all() and (err[1] <= bounds[shape[2]:][:, None]).all()  # ... within the bound


def test_a_lossy_codec_is_refused_where_the_bucket_forbids_it(node):
    proc, alice, _ = node
    layout = kv_layout(16)
    keys = keys_for(layout, 2, "forbidden")

    async def go():
        async with client(proc, alice, "strict") as c:
            await c.put_chunks(keys, kv_chunks(layout, 2, seed=1), layout, codec="int4")
    with pytest.raises(S3Error) as e:
        run(go())
    assert e.value.code == ErrorCode.KVCodecNotAllowed and keys[0] in e.value.message and "int4" in e.value.message


@pytest.mark.parametrize("transport", ["shm", "http"])
def test_corrupt_compressed_chunks_are_refused_naming_the_key(node, transport):
    """A chunk put with plain S3 whose header lies, or whose payload was changed, is refused by the kv-get with its key."""
    proc, alice, s3 = node
    layout = kv_layout(16)
    chunks = kv_chunks(layout, 3, seed=9)
    keys = keys_for(layout, 3, f"corrupt-{transport}")
    _put_and_fetch(proc, alice, "kvz", layout, chunks, keys, "zstd", transport)
    good = s3.get_object(Bucket="kvz", Key=keys[1])["Body"].read()
    bad_header = bytearray(good)
    bad_header[28] ^= 0x01  # decoded_bytes
    bad_payload = bytearray(good)
    bad_payload[-5] ^= 0xFF  # the last layer's bytes: its CRC no longer matches

    for bad, field in ((bad_header, "decoded_bytes"), (bad_payload, "layers[3].crc32c")):
        key = keys[1] + "-" + field.replace("[", "").replace("]", "")
        s3.put_object(Bucket="kvz", Key=key, Body=bytes(bad))

        async def go(key=key):
            async with client(proc, alice, "kvz") as c:
                return await c.fetch([keys[0], key, keys[2]], layout, transport, verify=True)
        with pytest.raises(S3Error) as e:
            run(go())
        assert e.value.code == ErrorCode.KVInvalidCompressedChunk, e.value
        assert key in e.value.message and field in e.value.message


def test_put_of_an_inconsistent_compressed_chunk_is_refused(node):
    proc, alice, _ = node
    layout = kv_layout(16)
    keys = keys_for(layout, 1, "put-corrupt")
    from client_sdk.compression import encode_layout_chunk

    obj = bytearray(encode_layout_chunk(memoryview(kv_chunks(layout, 1, seed=2)[0]), layout, "zstd"))
    obj[9] = 99  # unknown codec id

    async def go():
        async with client(proc, alice, "kvz") as c:
            await c.put_chunks(keys, [bytes(obj)])
    with pytest.raises(S3Error) as e:
        run(go())
    assert e.value.code == ErrorCode.KVInvalidCompressedChunk and keys[0] in e.value.message and "codec" in e.value.message
    with pytest.raises(ClientError):
        node[2].head_object(Bucket="kvz", Key=keys[0])


@pytest.mark.parametrize("transport", ["shm", "http"])
def test_a_bucket_codec_from_configuration_is_applied_by_the_node(node, transport):
    """compression.bucket_codecs: raw chunks put with their layout are stored compressed by the node, read back exact."""
    proc, alice, s3 = node
    layout = kv_layout(64)
    chunks = kv_chunks(layout, 3, seed=21)
    keys = keys_for(layout, 3, f"auto-{transport}")
    payload, _ = _put_and_fetch(proc, alice, "auto", layout, chunks, keys, "none", transport)
    assert np.array_equal(payload, reference(layout, chunks))
    stored = s3.get_object(Bucket="auto", Key=keys[0])["Body"].read()
    assert len(stored) < layout.chunk_bytes and stored[:8] == b"\xff\xff\xff\xffOCKZ" and stored[9] == 1  # codec id 1: zstd


def test_a_put_whose_chunks_do_not_match_its_stated_shape_is_refused(node):
    proc, alice, _ = node
    layout = kv_layout(16)
    keys = keys_for(layout, 1, "auto-short")

    async def go():
        async with client(proc, alice, "auto") as c:
            await c._put_batch([(keys[0], memoryview(b"\0" * 100))], shape_header(layout))
    with pytest.raises(S3Error) as e:
        run(go())
    assert e.value.code == ErrorCode.KVChunkSizeMismatch and keys[0] in e.value.message


SDK_DECODE_PATHS = [pytest.param(("http", False), id="http-gateway"), pytest.param(("http", True), id="http-direct"),
                    pytest.param(("rdma", False), id="rdma", marks=TRANSPORTS[2].marks)]


@pytest.mark.parametrize("path", SDK_DECODE_PATHS)
@pytest.mark.parametrize("chunk_tokens", [16, 64, 256])
def test_the_sdk_decodes_when_asked_and_the_link_carries_the_stored_bytes(node, chunk_tokens, path):
    """decode="client": raw and compressed (lossless) chunks arrive as stored (http: ENCODED frames; rdma: each layer
    packed into its place, PACKED frames) and the SDK's pool decodes them, exact."""
    proc, alice, s3 = node
    transport, direct = path
    layout = kv_layout(chunk_tokens)
    chunks = kv_chunks(layout, 6, seed=30 + chunk_tokens)
    keys = keys_for(layout, 6, f"sdk-decode-{chunk_tokens}-{transport}-{direct}")

    async def go():
        async with client(proc, alice, "kvz") as c:
            c.direct = direct
            await c.put_chunks(keys[:1], chunks[:1], layout)
            await c.put_chunks(keys[1:], chunks[1:], layout, codec="zstd")
            got = []
            async with c.fetch_layers(keys, layout, transport, decode="client", verify=True) as layers:
                async for layer, view in layers:
                    got.append((layer, bytes(view)))  # handed out only once decoded: compared below
            return got, layers.stats
    got, stats = run(go())
    expected = reference(layout, chunks)
    assert [layer for layer, _ in got] == list(range(layout.num_layers))
    for layer, view in got:
        assert view == expected[layer].tobytes()
    site = stats.server.decode_site
    assert site["site"] == "client" and site["wire_bytes"] < layout.payload_bytes(6), site  # the link carried the stored bytes


@pytest.mark.parametrize("transport", [TRANSPORTS[2]])
def test_over_rdma_a_layer_whose_stored_slices_outgrow_its_place_is_decoded_by_the_node(node, transport):
    proc, alice, _ = node
    layout = kv_layout(16)
    rng = np.random.default_rng(3)
    chunks = [rng.integers(0, 256, layout.chunk_bytes, dtype=np.uint8) for _ in range(3)]  # noise: zstd only adds bytes
    keys = keys_for(layout, 3, "rdma-outgrown")
    payload, stats = _put_and_fetch_decoded(proc, alice, layout, chunks, keys, transport)
    assert np.array_equal(payload, reference(layout, chunks))
    assert stats.server.decode_site["site"] == "node" and "do not fit" in stats.server.decode_site["reason"], stats.server.decode_site


def _put_and_fetch_decoded(proc, tenant, layout, chunks, keys, transport):
    async def go():
        async with client(proc, tenant, "kvz") as c:
            await c.put_chunks(keys, chunks, layout, codec="zstd")
            return await c.fetch(keys, layout, transport, decode="client", verify=True)
    return run(go())


def test_the_sdk_refuses_a_corrupt_slice_naming_it(node):
    proc, alice, s3 = node
    layout = kv_layout(16)
    chunks = kv_chunks(layout, 2, seed=41)
    keys = keys_for(layout, 2, "sdk-corrupt")
    run(_put_client(proc, alice, keys, chunks, layout))
    good = bytearray(s3.get_object(Bucket="kvz", Key=keys[1])["Body"].read())
    good[-3] ^= 0x08  # the last layer's encoded bytes: its stored CRC no longer matches
    s3.put_object(Bucket="kvz", Key=keys[1] + "-bad", Body=bytes(good))

    async def go():
        async with client(proc, alice, "kvz") as c:
            return await c.fetch([keys[0], keys[1] + "-bad"], layout, "http", decode="client", verify=True)
    with pytest.raises(S3Error) as e:
        run(go())
    assert e.value.code == ErrorCode.BadDigest and "layer 3 chunk #1" in e.value.message


async def _put_client(proc, tenant, keys, chunks, layout):
    async with client(proc, tenant, "kvz") as c:
        await c.put_chunks(keys, chunks, layout, codec="zstd")


def test_client_decoding_is_refused_over_shm(node):
    proc, alice, _ = node
    layout = kv_layout(16)

    async def go():
        async with client(proc, alice, "kvz") as c:
            return await c.fetch(keys_for(layout, 1, "x"), layout, "shm", decode="client")
    with pytest.raises(S3Error) as e:
        run(go())
    assert e.value.code == ErrorCode.KVInvalidDescriptor and "flags" in e.value.message


def test_the_sync_client_puts_compressed_and_fetches_decoded(node):
    from client_sdk.sync import SyncObjectCacheClient

    proc, alice, s3 = node
    layout = kv_layout(16)
    chunks = kv_chunks(layout, 3, seed=61)
    keys = keys_for(layout, 3, "sync")
    c = SyncObjectCacheClient(proc.endpoint, alice.access_key, alice.secret_key, "kvz")
    try:
        assert c.put_chunks(keys, chunks, layout, codec="zstd") == 3
        assert s3.head_object(Bucket="kvz", Key=keys[0])["ContentLength"] < layout.chunk_bytes
        payload, _ = c.fetch(keys, layout, "http", decode="client")
        assert np.array_equal(payload, reference(layout, chunks))
    finally:
        c.close()


def test_a_cancelled_client_decode_leaves_no_thread_writing_into_the_destination(node, monkeypatch):
    import asyncio
    import threading

    from client_sdk import decoding

    proc, alice, _ = node
    layout = kv_layout(16)
    chunks = kv_chunks(layout, 4, seed=71)
    keys = keys_for(layout, 4, "sdk-cancel")
    run(_put_client(proc, alice, keys, chunks, layout))
    entered, release, running = threading.Event(), threading.Event(), []
    real = decoding.decode_slices

    def slow(*args):
        running.append(1)
        entered.set()
        release.wait(10)
        try:
            return real(*args)
        finally:
            running.pop()

    monkeypatch.setattr(decoding, "decode_slices", slow)

    async def go():
        async with client(proc, alice, "kvz") as c:
            task = asyncio.ensure_future(c.fetch(keys, layout, "http", decode="client"))
            await asyncio.get_running_loop().run_in_executor(None, entered.wait, 10)
            task.cancel()
            threading.Timer(0.3, release.set).start()
            try:
                await task
            except asyncio.CancelledError:
                pass
            return list(running)
    assert run(go()) == []
