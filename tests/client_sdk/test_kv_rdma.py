"""The rdma transport (NIXL engine, real UCX between processes): registration, tenant isolation, transport choice.

Byte-exactness over the G×N grid, layer-by-layer delivery, client disconnects and storage-server kills
are covered by the transport-parametrized tests (kvsupport.TRANSPORTS) beside those of shm and http.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from kvsupport import client, keys_for, make_chunks, reference, rpc, run, tiny_layout
from rawhttp import signed

from client_sdk import ObjectCacheClient
from client_sdk.rdma import rdma_available
from protocol.wire import Descriptor, Target, TransportKind, encode_descriptor

pytestmark = pytest.mark.skipif(not rdma_available()[0], reason=f"rdma transport unavailable here: {rdma_available()[1]}")
LAYOUT = tiny_layout(16, num_layers=4)


@pytest.fixture(scope="module")
def rdma_bucket(server, tenants, s3):
    bucket = "kv-rdma"
    s3.create_bucket(Bucket=bucket)
    keys, chunks = keys_for(LAYOUT, 40, "rdma"), make_chunks(LAYOUT, 40, seed=31)

    async def put():
        async with client(server, tenants["alice"], bucket) as c:
            await c.put_chunks(keys, chunks, LAYOUT)

    run(put())
    return bucket, keys, chunks


def test_memory_registered_by_one_tenant_is_never_written_for_another(server, tenants, rdma_bucket, s3_bob):
    bucket, keys, chunks = rdma_bucket
    s3_bob.create_bucket(Bucket="kv-rdma-bob")

    async def scenario():
        async with client(server, tenants["alice"], bucket) as alice, client(server, tenants["bob"], "kv-rdma-bob") as bob:
            bobs = make_chunks(LAYOUT, len(keys), seed=32)  # other bytes under the same keys: a cross-tenant write would show
            assert not np.array_equal(reference(LAYOUT, bobs), reference(LAYOUT, chunks))
            await bob.put_chunks(keys, bobs, LAYOUT)
            payload, stats = await alice.fetch(keys, LAYOUT, "rdma")  # registers alice's buffer
            assert stats.transport == "rdma" and np.array_equal(payload, reference(LAYOUT, chunks))
            buffer = alice._destinations[TransportKind.RDMA]._buffers[0]
            before = bytes(buffer.buf[: LAYOUT.payload_bytes(40)])
            stolen = Target(TransportKind.RDMA, buffer.region_id, buffer.token, 0, LAYOUT.payload_bytes(40))
            body = encode_descriptor(Descriptor(keys, LAYOUT.num_layers, LAYOUT.chunk_tokens, LAYOUT.per_layer_chunk_bytes, stolen))
            r = signed(server.endpoint, tenants["bob"], "POST", "/kv-rdma-bob?kv-get", body=body)
            assert r.status == 403 and b"AccessDenied" in r.body
            assert bytes(buffer.buf[: LAYOUT.payload_bytes(40)]) == before
            outside = Target(TransportKind.RDMA, buffer.region_id, buffer.token, buffer.buf.nbytes - 8, LAYOUT.payload_bytes(40))
            body = encode_descriptor(Descriptor(keys, LAYOUT.num_layers, LAYOUT.chunk_tokens, LAYOUT.per_layer_chunk_bytes, outside))
            r = signed(server.endpoint, tenants["alice"], "POST", f"/{bucket}?kv-get", body=body)
            assert r.status == 400 and b"KVTargetTooSmall" in r.body
            theirs, _ = await bob.fetch(keys, LAYOUT, "rdma")
            assert np.array_equal(theirs, reference(LAYOUT, bobs))  # bob's own buffer works, with bob's bytes

    run(scenario())


def test_registration_names_what_is_wrong(server, tenants):
    good = {"engine": "nixl", "agent": base64.b64encode(b"not metadata").decode(), "addr": 4096, "size": 4096}
    for body, code, field in [
        ({**good, "engine": "verbs"}, b"NotImplemented", b"engine"),
        ({**good, "agent": "***"}, b"InvalidArgument", b"agent"),
        ({**good, "size": 0}, b"InvalidArgument", b"size"),
        (good, b"InvalidArgument", b"agent"),  # metadata the engine cannot parse
    ]:
        r = signed(server.endpoint, tenants["alice"], "POST", "/?kv-register-rdma", body=json.dumps(body).encode())
        assert r.status in (400, 501) and code in r.body and field in r.body, r.body


def test_auto_picks_shm_on_this_host_and_rdma_for_a_remote_endpoint(tenants):
    t = tenants["alice"]
    assert ObjectCacheClient("http://127.0.0.1:9000", t.access_key, t.secret_key, "b")._transport_kind("auto") == TransportKind.SHM
    assert ObjectCacheClient("http://kv.example:9000", t.access_key, t.secret_key, "b")._transport_kind("auto") == TransportKind.RDMA


def test_the_callers_own_memory_is_registered_once_and_written_in_place(server, tenants, rdma_bucket):
    bucket, keys, chunks = rdma_bucket
    expected = reference(LAYOUT, chunks)

    async def scenario():
        async with client(server, tenants["alice"], bucket) as c:
            mine, other = np.zeros(LAYOUT.payload_bytes(40) + 100, np.uint8), bytearray(LAYOUT.payload_bytes(40))
            before = rpc(server.rpc_socket, "status")["regions"]
            for out in (mine, mine, other, mine):
                async with c.fetch_layers(keys, LAYOUT, "rdma", out=out) as layers:
                    async for _ in layers:
                        pass
                written = np.frombuffer(out, np.uint8)[: expected.size]
                assert np.array_equal(written.reshape(expected.shape), expected)
            assert rpc(server.rpc_socket, "status")["regions"] == before + 2  # one registration per buffer, reused
            for bad, why in ((bytes(expected.size), "writable"), (np.zeros(10, np.uint8), "the payload needs"), (3, "buffer protocol")):
                with pytest.raises(ValueError, match=why):
                    await c.fetch(keys, LAYOUT, "rdma", out=bad)

    run(scenario())
