"""The KV path end to end: real gateway + storage server, the SDK, both transports."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from awscrt.checksums import crc32c
from kvsupport import TRANSPORTS, client, keys_for, make_chunks, reference, rpc, run, tiny_layout
from rawhttp import signed
from support import boto_client

from client_sdk import KVLayout, ObjectCacheError
from protocol.wire import FRAME_SIZE, Descriptor, FrameType, Mode, Target, TransportKind, encode_descriptor, unpack_frame

G_VALUES = [16, 64, 256]
N_MAX = 3584  # a 64K-token prefix at G=16


@pytest.fixture(scope="module")
def stored(server, tenants, s3):
    """For each G: N_MAX chunk objects stored through kv-put, with their numpy reference."""
    bucket = "kv-e2e"
    s3.create_bucket(Bucket=bucket)
    data = {}

    async def put_all():
        async with client(server, tenants["alice"], bucket) as c:
            for g in G_VALUES:
                layout = tiny_layout(g)
                keys = keys_for(layout, N_MAX, f"model-g{g}")
                chunks = make_chunks(layout, N_MAX, seed=g)
                assert await c.put_chunks(keys, chunks, layout) == N_MAX
                data[g] = (layout, keys, chunks)

    run(put_all())
    return bucket, data


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("g", G_VALUES)
@pytest.mark.parametrize("n", [1, 97, N_MAX])
def test_fetch_equals_reference_assembly(server, tenants, stored, transport, g, n):
    bucket, data = stored
    layout, keys, chunks = data[g]
    expected = reference(layout, chunks[:n])

    async def fetch():
        async with client(server, tenants["alice"], bucket) as c:
            assert await c.lookup(keys[:n]) == n
            seen = []
            async with c.fetch_layers(keys[:n], layout, transport=transport) as layers:
                async for idx, view in layers:
                    assert np.array_equal(np.frombuffer(view, np.uint8), expected[idx]), f"layer {idx}"
                    seen.append(idx)
                assert layers.stats.transport == transport
                # CRC32C is checked where bytes crossed sockets, not over shm (the server wrote these very pages).
                assert layers.verify == (transport == "http")
            assert seen == list(range(layout.num_layers))

    run(fetch())


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("mode", ["chunkwise", "layerwise"])
def test_both_modes_deliver_the_same_bytes(server, tenants, stored, transport, mode):
    bucket, data = stored
    layout, keys, chunks = data[64]

    async def fetch():
        async with client(server, tenants["alice"], bucket) as c:
            payload, stats = await c.fetch(keys[:500], layout, transport, mode=mode)
            assert stats.mode == mode
            assert np.array_equal(payload, reference(layout, chunks[:500]))
            assert stats.server.storage_read_s > 0 and stats.server.total_s > 0 and stats.request_id == stats.server.request_id
            assert stats.server.setup_s > 0 and len(stats.layer_arrival_s) == layout.num_layers
            assert stats.layer_arrival_s == sorted(stats.layer_arrival_s)
            timeline = stats.server.layer_timeline  # read start, read end, ready: per layer, in order
            if mode == "chunkwise":
                assert timeline == []
            else:
                assert len(timeline) == layout.num_layers
                assert all(start <= end <= ready for start, end, ready in timeline)
                assert [t[2] for t in timeline] == sorted(t[2] for t in timeline) and timeline[-1][2] <= stats.server.total_s

    run(fetch())


def test_auto_mode_uses_threshold(server, tenants, stored):
    """Θ defaults to 32 MiB: these small payloads go chunkwise."""
    bucket, data = stored
    layout, keys, _ = data[16]

    async def fetch():
        async with client(server, tenants["alice"], bucket) as c:
            _, stats = await c.fetch(keys[:10], layout, "shm")
            assert stats.mode == "chunkwise"

    run(fetch())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_layer_zero_reaches_consumer_before_last_layer_is_written(gated_node, tenants, transport):
    """Shown with events: the server is held before writing layer L-1 until the
    consumer has received layer 0; if delivery were not layer by layer, the
    consumer would never see layer 0 while the server is held (bounded wait)."""
    bucket = f"kv-layer-order-{transport}"
    boto_client(gated_node.endpoint, tenants["alice"]).create_bucket(Bucket=bucket)
    layout = tiny_layout(16)
    keys, chunks = keys_for(layout, 200, f"order-{transport}"), make_chunks(layout, 200, seed=16)
    expected = reference(layout, chunks)
    last = layout.num_layers - 1
    gate = gated_node.gate

    async def fetch():
        async with client(gated_node, tenants["alice"], bucket) as c:
            await c.put_chunks(keys, chunks, layout)
            gate.hold_before(last)
            async with c.fetch_layers(keys, layout, transport=transport, mode="layerwise") as layers:
                it = layers.__aiter__()
                idx, view = await asyncio.wait_for(it.__anext__(), 30)
                assert idx == 0 and np.array_equal(np.frombuffer(view, np.uint8), expected[0])
                # We hold layer 0; the server is (now, and so was then) stopped before layer L-1.
                assert gate.wait_held(30)
                if transport in ("shm", "rdma"):  # written straight into our memory: layer L-1 is not there yet
                    assert not np.array_equal(np.frombuffer(layers.layer(last), np.uint8), expected[last])
                assert gate.open()
                rest = [i async for i, _ in it]
                assert rest == list(range(1, layout.num_layers))
                assert np.array_equal(np.frombuffer(layers.layer(last), np.uint8), expected[last])

    run(fetch())


def test_shm_region_is_registered_once_and_reused(server, tenants, stored):
    bucket, data = stored
    layout, keys, _ = data[16]

    async def fetch():
        async with client(server, tenants["alice"], bucket) as c:
            before = rpc(server.rpc_socket, "status")["regions"]
            for _ in range(5):
                await c.fetch(keys[:50], layout, "shm")
            assert rpc(server.rpc_socket, "status")["regions"] == before + 1
        assert rpc(server.rpc_socket, "status")["regions"] == before  # unregistered on close

    run(fetch())


def test_32_concurrent_fetches_from_4_tenants(server, tenants, s3):
    names = ["alice", "bob", "carol", "dave"]
    layout = tiny_layout(16)

    async def scenario():
        clients = {}
        per_tenant = {}
        for i, name in enumerate(names):
            c = client(server, tenants[name], f"kv-conc-{name}")
            await c.__aenter__()
            await c.ensure_bucket()
            keys = keys_for(layout, 300, f"tenant-{name}")
            chunks = make_chunks(layout, 300, seed=100 + i)
            await c.put_chunks(keys, chunks, layout)
            clients[name], per_tenant[name] = c, (keys, chunks)

        async def one(k: int):
            name = names[k % 4]
            keys, chunks = per_tenant[name]
            n = 50 + 7 * k
            transport = "shm" if k % 2 else "http"
            payload, _ = await clients[name].fetch(keys[:n], layout, transport)
            assert np.array_equal(payload, reference(layout, chunks[:n])), (name, transport, n)
            return k

        try:
            assert sorted(await asyncio.gather(*(one(k) for k in range(32)))) == list(range(32))
        finally:
            for c in clients.values():
                await c.close()

    run(scenario())


def test_put_chunks_is_idempotent_and_immutable(server, tenants, stored):
    bucket, data = stored
    layout, keys, chunks = data[16]

    async def scenario():
        async with client(server, tenants["alice"], bucket) as c:
            assert await c.put_chunks(keys[:3], chunks[:3], layout) == 3  # identical bytes: no-op
            with pytest.raises(ObjectCacheError) as e:
                await c.put_chunks(keys[:1], [np.zeros(layout.chunk_bytes, np.uint8)], layout)
            assert keys[0] in e.value.message
            payload, _ = await c.fetch(keys[:3], layout, "http")
            assert np.array_equal(payload, reference(layout, chunks[:3]))

    run(scenario())


def test_chunks_are_ordinary_objects(stored, s3):
    bucket, data = stored
    layout, keys, chunks = data[256]
    got = s3.get_object(Bucket=bucket, Key=keys[5])
    assert got["Body"].read() == chunks[5].tobytes()
    assert got["ContentType"] == "application/x-objectcache-kv-chunk"
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="model-g256/", MaxKeys=5)
    assert listed["KeyCount"] == 5


def test_lookup_counts_the_leading_run(server, tenants, stored):
    bucket, data = stored
    layout, keys, _ = data[16]

    async def scenario():
        async with client(server, tenants["alice"], bucket) as c:
            assert await c.lookup(keys[:10]) == 10
            assert await c.lookup(keys[:4] + ["model-g16/missing"] + keys[5:10]) == 4
            assert await c.lookup(["model-g16/missing"] + keys[:3]) == 0
            assert await c.lookup([]) == 0

    run(scenario())


def test_http_layer_buffers_are_not_reused_before_their_bytes_are_sent(server, tenants, s3):
    """The http transport stages layers in two rotating buffers. Layers of 512 KiB outrun the
    socket, so a buffer refilled before its bytes were flushed would corrupt what the client
    receives (this failed in roughly one fetch in four before the sink waited for a full flush)."""
    bucket = "kv-http-rotation"
    s3.create_bucket(Bucket=bucket)
    layout = KVLayout(num_layers=32, chunk_tokens=64, kv_heads=8, head_dim=8, dtype="bfloat16")  # S = 16 KiB
    n = 32
    keys, chunks = keys_for(layout, n, "rotation"), make_chunks(layout, n, seed=5)
    expected = reference(layout, chunks)

    async def fetch_repeatedly():
        async with client(server, tenants["alice"], bucket) as c:
            await c.put_chunks(keys, chunks, layout)
            for attempt in range(16):
                async with c.fetch_layers(keys, layout, "http", mode="layerwise", verify=False) as layers:
                    async for _ in layers:
                        pass
                    got = np.frombuffer(layers.payload, np.uint8).reshape(layout.num_layers, -1)
                    bad = [i for i in range(layout.num_layers) if not np.array_equal(got[i], expected[i])]
                    assert bad == [], f"fetch {attempt}: layers {bad} differ"

    run(fetch_repeatedly())


@pytest.mark.parametrize("mode", [Mode.CHUNKWISE, Mode.LAYERWISE])
def test_layer_frames_carry_crc32c_unless_the_descriptor_waives_it(server, tenants, stored, mode):
    """Each LAYER frame holds its layer's CRC32C; a client that will not verify waives it and gets 0."""
    bucket, data = stored
    layout, keys, chunks = data[16]
    n = 40
    expected = reference(layout, chunks[:n])

    def layer_checksums(wanted: bool) -> list[int]:
        d = Descriptor(keys[:n], layout.num_layers, layout.chunk_tokens, layout.per_layer_chunk_bytes,
                       Target(TransportKind.HTTP, length=layout.payload_bytes(n)), mode=mode, layer_checksums=wanted)
        r = signed(server.endpoint, tenants["alice"], "POST", f"/{bucket}?kv-get", body=encode_descriptor(d))
        assert r.status == 200
        sums, pos = {}, 0
        while pos < len(r.body):
            frame = unpack_frame(r.body[pos : pos + FRAME_SIZE])
            pos += FRAME_SIZE + (frame.length if frame.has_payload else 0)
            if frame.type == FrameType.LAYER:
                sums[frame.layer] = frame.checksum
        return [sums[i] for i in range(layout.num_layers)]

    assert layer_checksums(True) == [crc32c(expected[i].tobytes()) for i in range(layout.num_layers)]
    assert layer_checksums(False) == [0] * layout.num_layers


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_verify_overrides_the_transport_default(server, tenants, stored, transport):
    """verify=True over shm asks the server for CRCs and checks them; verify=False over http waives them."""
    bucket, data = stored
    layout, keys, chunks = data[64]
    expected = reference(layout, chunks[:100])
    verify = transport != "http"  # the opposite of each transport's default

    async def fetch():
        async with client(server, tenants["alice"], bucket) as c:
            async with c.fetch_layers(keys[:100], layout, transport, verify=verify) as layers:
                async for idx, view in layers:
                    assert np.array_equal(np.frombuffer(view, np.uint8), expected[idx])
                assert layers.verify is verify

    run(fetch())


def test_a_deleted_or_replaced_chunk_is_never_served_from_a_cached_file(server, tenants, s3):
    """The storage server keeps chunk files open between fetches; deletes and re-puts still win."""
    bucket = "kv-replaced"
    s3.create_bucket(Bucket=bucket)
    layout = tiny_layout(16, num_layers=4)
    keys = keys_for(layout, 8, "replaced")
    old, new = make_chunks(layout, 8, seed=1), make_chunks(layout, 8, seed=2)

    async def scenario():
        async with client(server, tenants["alice"], bucket) as c:
            await c.put_chunks(keys, old, layout)
            payload, _ = await c.fetch(keys, layout, "http")
            assert np.array_equal(payload, reference(layout, old))
            s3.delete_object(Bucket=bucket, Key=keys[3])
            with pytest.raises(ObjectCacheError) as e:
                await c.fetch(keys, layout, "http")
            assert e.value.code.name == "NoSuchKey" and keys[3] in e.value.message
            s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})
            await c.put_chunks(keys, new, layout)
            payload, _ = await c.fetch(keys, layout, "http")
            assert np.array_equal(payload, reference(layout, new))

    run(scenario())


@pytest.mark.parametrize("mode", ["chunkwise", "layerwise"])
def test_mapped_and_unmapped_chunks_deliver_the_same_bytes(server, tenants, s3, mode):
    """Chunk files are gathered from their mappings where a layer's slices are whole rows of a page-aligned
    slot (every layout above) and read with preadv where they are not (S = 96 bytes here): same bytes."""
    bucket = f"kv-unmapped-{mode}"
    s3.create_bucket(Bucket=bucket)
    odd = KVLayout(num_layers=5, chunk_tokens=16, kv_heads=3, head_dim=1, dtype="uint8")  # S = 96: 4096 % 96 != 0
    keys = keys_for(odd, 300, f"odd-{mode}")
    chunks = make_chunks(odd, 300, seed=5)

    async def scenario():
        async with client(server, tenants["alice"], bucket) as c:
            await c.put_chunks(keys, chunks, odd)
            for transport in ("http", "shm"):
                payload, stats = await c.fetch(keys, odd, transport, mode=mode)
                assert stats.mode == mode and np.array_equal(payload, reference(odd, chunks))

    run(scenario())
