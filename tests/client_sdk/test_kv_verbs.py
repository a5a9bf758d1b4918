"""kv-get over the rdma transport's pyverbs engine, end to end, with the fake verbs layer as the NIC.

A real gateway and storage server (in this process, so both ends can be handed the fake device)
configured with ``storage_server.rdma_engine = "pyverbs"``; the SDK registers through the signed
control plane (queue pair exchange in kv-register-rdma), the server WRITEs each layer into the
client's memory region and announces it with a tagged WRITE_WITH_IMM, and the layer-ready
iterator hands a layer out only once its immediate arrived.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from fakeverbs import Fabric
from inprocess import InProcessNode
from kvsupport import keys_for, make_chunks, reference, run, tiny_layout
from rawhttp import signed
from support import boto_client, write_config

from client_sdk import ObjectCacheClient, ObjectCacheError
from protocol.pyverbs_device import verbs_available
from protocol.rdma_token import RdmaToken
from protocol.verbs import decode_imm
from protocol.wire import Descriptor, Target, TransportKind, encode_descriptor

SERVER_LID, CLIENT_LID = 1, 2


@pytest.fixture(scope="module")
def verbs_node(tmp_path_factory, tenants):
    root = tmp_path_factory.mktemp("verbs")
    config = write_config(root / "objectcache.toml", root / "data", list(tenants.values()),
                          extra=f'\n[storage_server]\nsocket = "{root / "ss.sock"}"\nrdma_engine = "pyverbs"\n')
    fabric = Fabric()
    # Small limits so a layer's slices take several work requests.
    node = InProcessNode(config, open_verbs=lambda name: fabric.device(SERVER_LID, max_sge=2, max_msg_bytes=4096)).start()
    node.fabric = fabric
    yield node
    node.stop()


def verbs_client(node, tenant, bucket: str) -> ObjectCacheClient:
    return ObjectCacheClient(node.endpoint, tenant.access_key, tenant.secret_key, bucket=bucket, rdma_engine="pyverbs",
                             open_verbs=lambda: node.fabric.device(CLIENT_LID))


@pytest.fixture(scope="module")
def stored(verbs_node, tenants):
    boto_client(verbs_node.endpoint, tenants["alice"]).create_bucket(Bucket="kv-verbs")
    data = {}

    async def put():
        async with verbs_client(verbs_node, tenants["alice"], "kv-verbs") as c:
            for g in (16, 64):
                layout = tiny_layout(g, num_layers=8)
                keys, chunks = keys_for(layout, 300, f"verbs-{g}"), make_chunks(layout, 300, seed=g)
                await c.put_chunks(keys, chunks, layout)
                data[g] = (layout, keys, chunks)

    run(put())
    return data


@pytest.mark.parametrize("g,n,mode", [(16, 1, "layerwise"), (16, 300, "layerwise"), (64, 97, "chunkwise"), (64, 300, "layerwise")])
def test_fetch_over_pyverbs_equals_the_reference(verbs_node, tenants, stored, g, n, mode):
    layout, keys, chunks = stored[g]
    expected = reference(layout, chunks[:n])
    fabric = verbs_node.fabric
    before = len(fabric.writes())

    async def fetch():
        async with verbs_client(verbs_node, tenants["alice"], "kv-verbs") as c:
            seen = []
            async with c.fetch_layers(keys[:n], layout, transport="rdma", mode=mode) as layers:
                async for idx, view in layers:
                    assert np.array_equal(np.frombuffer(view, np.uint8), expected[idx]), f"layer {idx}"
                    seen.append(idx)
                assert layers.stats.transport == "rdma" and layers.stats.mode == mode
            assert seen == list(range(layout.num_layers))

    run(fetch())
    posted = fabric.writes()[before:]
    notes = [w for w in posted if w.imm is not None]
    assert [decode_imm(w.imm)[1] for w in notes] == list(range(layout.num_layers))  # one immediate per layer, in order
    assert len({decode_imm(w.imm)[0] for w in notes}) == 1  # all of this request's tag
    assert all(len(w.sges) <= 2 and w.length <= 4096 for w in posted)
    if mode == "layerwise":  # each layer's bytes were written before its immediate
        layer_bytes = n * layout.per_layer_chunk_bytes
        written = 0
        for w in posted:
            if w.imm is None:
                written += w.length
            else:
                assert written == (decode_imm(w.imm)[1] + 1) * layer_bytes


def test_a_failed_rdma_write_is_a_clear_error_and_the_sdk_registers_afresh(verbs_node, tenants, stored):
    layout, keys, chunks = stored[16]
    fabric = verbs_node.fabric

    async def scenario():
        async with verbs_client(verbs_node, tenants["alice"], "kv-verbs") as c:
            await c.fetch(keys[:50], layout, "rdma")
            qps = set(fabric.qps)
            fabric.fail_next("write", "IBV_WC_REM_ACCESS_ERR")
            with pytest.raises(ObjectCacheError) as e:
                await c.fetch(keys[:50], layout, "rdma", mode="layerwise")
            assert e.value.code.name == "ServiceUnavailable" and "RDMA write to the client failed" in e.value.message
            # The server forgot the broken region (KVNoSuchRegion); the SDK connected a new queue pair and retried.
            payload, _ = await c.fetch(keys[:50], layout, "rdma")
            assert np.array_equal(payload, reference(layout, chunks[:50]))
            assert set(fabric.qps) - qps, "no new queue pair was connected"

    run(scenario())


def test_layer_waits_for_its_immediate(verbs_node, tenants, stored):
    """A failed WRITE_WITH_IMM (the notification) fails the fetch: no layer is handed out unannounced."""
    layout, keys, _ = stored[16]

    async def scenario():
        async with verbs_client(verbs_node, tenants["alice"], "kv-verbs") as c:
            verbs_node.fabric.fail_next("imm", "IBV_WC_RNR_RETRY_EXC_ERR")
            seen = []
            with pytest.raises(ObjectCacheError) as e:
                async with c.fetch_layers(keys[:20], layout, "rdma", mode="layerwise") as layers:
                    async for idx, _ in layers:
                        seen.append(idx)
            assert seen == [] and "IBV_WC_RNR_RETRY_EXC_ERR" in e.value.message

    run(scenario())


def test_memory_registered_by_one_tenant_is_never_written_for_another(verbs_node, tenants, stored):
    layout, keys, chunks = stored[16]

    async def scenario():
        async with verbs_client(verbs_node, tenants["alice"], "kv-verbs") as alice:
            await alice.fetch(keys[:10], layout, "rdma")  # registers alice's buffer and queue pair
            buffer = alice._destinations[TransportKind.RDMA]._buffers[0]
            before, writes = bytes(buffer.buf[:256]), len(verbs_node.fabric.writes())
            boto_client(verbs_node.endpoint, tenants["bob"]).create_bucket(Bucket="kv-verbs-bob")
            stolen = Target(TransportKind.RDMA, buffer.region_id, buffer.token, 0, layout.payload_bytes(10))
            body = encode_descriptor(Descriptor(keys[:10], layout.num_layers, layout.chunk_tokens, layout.per_layer_chunk_bytes, stolen))
            r = signed(verbs_node.endpoint, tenants["bob"], "POST", "/kv-verbs-bob?kv-get", body=body)
            assert r.status == 403 and b"AccessDenied" in r.body
            assert len(verbs_node.fabric.writes()) == writes and bytes(buffer.buf[:256]) == before

    run(scenario())


def test_an_engine_the_server_does_not_run_is_refused_clearly(verbs_node, tenants, stored):
    """The server runs pyverbs; a NIXL registration names the key to change."""
    body = b'{"engine": "nixl", "agent": "AAAA", "addr": 4096, "size": 4096}'
    r = signed(verbs_node.endpoint, tenants["alice"], "POST", "/?kv-register-rdma", body=body)
    assert r.status == 501 and b"storage_server.rdma_engine" in r.body and b"engine" in r.body


def test_a_new_request_on_the_same_buffer_gets_a_new_tag(verbs_node, tenants, stored):
    """Walk away mid-transfer, fetch again into the same buffer: the server tags the new request afresh, so
    announcements of the abandoned one still in flight (the client drops other tags) cannot pass for the new one's."""
    layout, keys, chunks = stored[64]
    fabric = verbs_node.fabric

    async def scenario():
        async with verbs_client(verbs_node, tenants["alice"], "kv-verbs") as c:
            mark = len(fabric.writes())
            async with c.fetch_layers(keys, layout, "rdma", mode="layerwise") as layers:
                async for _ in layers:
                    break
            buffer = c._destinations[TransportKind.RDMA]._buffers[0]
            abandoned = buffer.tag
            payload, _ = await c.fetch(keys, layout, "rdma", mode="layerwise")
            assert np.array_equal(payload, reference(layout, chunks))
            assert c._destinations[TransportKind.RDMA]._buffers == [buffer]  # the same memory and queue pair
            tags = [decode_imm(w.imm)[0] for w in fabric.writes()[mark:] if w.imm is not None]
            assert buffer.tag != abandoned and set(tags) == {abandoned, buffer.tag}
            assert tags.count(buffer.tag) == layout.num_layers

    run(scenario())


def test_auto_picks_shm_on_this_host_rdma_where_an_engine_runs_and_http_otherwise(tenants):
    t = tenants["alice"]
    fabric = Fabric()

    def kind(endpoint: str, **kw) -> TransportKind:
        return ObjectCacheClient(endpoint, t.access_key, t.secret_key, "b", **kw)._transport_kind("auto")

    assert kind("http://127.0.0.1:9000", rdma_engine="pyverbs", open_verbs=lambda: fabric.device(9)) == TransportKind.SHM
    assert kind("http://kv.example:9000", rdma_engine="pyverbs", open_verbs=lambda: fabric.device(9)) == TransportKind.RDMA
    if not verbs_available()[0]:  # no device here: nothing to write into us over RDMA
        assert kind("http://kv.example:9000", rdma_engine="pyverbs") == TransportKind.HTTP
        with pytest.raises(ValueError, match="transport 'rdma' is not available in this process: pyverbs"):
            ObjectCacheClient("http://kv.example:9000", t.access_key, t.secret_key, "b", rdma_engine="pyverbs")._transport_kind("rdma")
    with pytest.raises(ValueError, match="rdma_engine must be"):
        kind("http://kv.example:9000", rdma_engine="ucx")


def test_x_amz_rdma_token_over_pyverbs_must_name_the_registered_region_and_queue_pair(verbs_node, tenants, stored):
    s3 = boto_client(verbs_node.endpoint, tenants["alice"])
    body = bytes(range(256)) * 40
    s3.put_object(Bucket="kv-verbs", Key="plain", Body=body)

    async def go():
        async with verbs_client(verbs_node, tenants["alice"], "kv-verbs") as c:
            assert (await c.get_object_rdma("plain")).tobytes() == body
            async with c.rdma_memory(len(body)) as (token, view):
                t = RdmaToken.parse(token)
                assert t.rkey and t.qp_num and t.lid == CLIENT_LID
                view[:16] = b"\0" * 16
                for wrong in (replace(t, rkey=t.rkey + 1), replace(t, qp_num=t.qp_num + 1)):
                    r = signed(verbs_node.endpoint, tenants["alice"], "GET", "/kv-verbs/plain", headers={"x-amz-rdma-token": wrong.encode()})
                    assert r.status == 501 and r.headers["x-amz-rdma-reply"] == "501" and b"does not describe memory" in r.body
                assert bytes(view[:16]) == b"\0" * 16

    run(go())


def test_the_callers_own_memory_gets_its_own_queue_pair_once(verbs_node, tenants, stored):
    layout, keys, chunks = stored[16]
    mine = np.zeros(layout.payload_bytes(30), np.uint8)

    async def go():
        async with verbs_client(verbs_node, tenants["alice"], "kv-verbs") as c:
            qps = set(verbs_node.fabric.qps)
            for _ in range(3):
                await c.fetch(keys[:30], layout, "rdma", out=mine)
                assert np.array_equal(mine.reshape(layout.num_layers, -1), reference(layout, chunks[:30]))
            assert len(set(verbs_node.fabric.qps) - qps) == 2  # one queue pair each side, for this memory, reused

    run(go())
