"""The KV request limits the README's table promises: kv-put body (``gateway.kv_max_put_bytes``),
descriptor and key list (64 MiB) are each a 400 naming the limit and store nothing; 16 pending
shm registrations per tenant, then 503 (others' unaffected)."""

from __future__ import annotations

import json

import pytest
from kvsupport import client, keys_for, make_chunks, run, tiny_layout
from rawhttp import signed
from support import ServerProcess, boto_client, make_tenants, write_config

from protocol.wire import encode_keys, encode_put_batch

PUT_LIMIT = 1 << 20
MAX_DESCRIPTOR_BYTES = 64 << 20  # descriptor and key list (README "Limits")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("kvlimits")
    people = make_tenants("alice", "bob")
    config = write_config(root / "c.toml", root / "data", people,
                          extra=f'\n[gateway]\nkv_max_put_bytes = {PUT_LIMIT}\n[storage_server]\nsocket = "{root / "ss.sock"}"\n')
    proc = ServerProcess(config).start()
    boto_client(proc.endpoint, people[0]).create_bucket(Bucket="limits")
    yield proc, {t.name: t for t in people}
    proc.stop()


def batch(n_items: int, item_bytes: int, prefix: str) -> bytes:
    return b"".join(bytes(p) for p in encode_put_batch([(f"{prefix}/{i}", bytes([i % 256]) * item_bytes) for i in range(n_items)]))


def test_a_kv_put_over_kv_max_put_bytes_is_a_400_and_stores_nothing(node):
    proc, people = node
    over = batch(2, PUT_LIMIT // 2, "over")
    assert len(over) > PUT_LIMIT
    r = signed(proc.endpoint, people["alice"], "POST", "/limits?kv-put", body=over, payload_hash="UNSIGNED-PAYLOAD")
    assert r.status == 400 and f"exceeds {PUT_LIMIT} bytes".encode() in r.body, r.body
    under = batch(2, PUT_LIMIT // 2 - 64, "under")
    assert len(under) <= PUT_LIMIT
    r = signed(proc.endpoint, people["alice"], "POST", "/limits?kv-put", body=under, payload_hash="UNSIGNED-PAYLOAD")
    assert r.status == 200, r.body
    r = signed(proc.endpoint, people["alice"], "POST", "/limits?kv-lookup", body=encode_keys(["over/0", "under/0"]))
    assert r.status == 200 and json.loads(r.body)["hits"] == 0  # "over/0" leads: nothing of the refused batch is stored
    r = signed(proc.endpoint, people["alice"], "POST", "/limits?kv-lookup", body=encode_keys(["under/0", "under/1"]))
    assert json.loads(r.body)["hits"] == 2


@pytest.mark.parametrize("op", ["kv-get", "kv-lookup"])
def test_a_descriptor_or_key_list_over_64_mib_is_a_400(node, op):
    proc, people = node
    for size, refused in ((MAX_DESCRIPTOR_BYTES + 1, True), (MAX_DESCRIPTOR_BYTES, False)):
        r = signed(proc.endpoint, people["alice"], "POST", f"/limits?{op}", body=b"\0" * size, payload_hash="UNSIGNED-PAYLOAD")
        assert r.status == 400, r.body[:300]
        # Over the limit: refused for its size; at the limit: read whole, then refused as what it is (not a descriptor).
        assert (f"exceeds {MAX_DESCRIPTOR_BYTES} bytes".encode() in r.body) == refused, r.body[:300]


def test_sixteen_pending_registrations_then_503(node):
    proc, people = node
    tickets = []
    for i in range(16):
        r = signed(proc.endpoint, people["bob"], "POST", "/?kv-register", body=json.dumps({"size": 4096}).encode())
        assert r.status == 200, (i, r.body)
        tickets.append(json.loads(r.body)["ticket"])
    assert len(set(tickets)) == 16
    r = signed(proc.endpoint, people["bob"], "POST", "/?kv-register", body=json.dumps({"size": 4096}).encode())
    assert r.status == 503 and b"ServiceUnavailable" in r.body and b"16 registrations pending" in r.body, r.body
    r = signed(proc.endpoint, people["alice"], "POST", "/?kv-register", body=json.dumps({"size": 4096}).encode())
    assert r.status == 200, r.body  # the cap is per tenant

    layout = tiny_layout(16, num_layers=2)
    keys = keys_for(layout, 2, "reg")

    async def alice_shm_fetch():  # alice's own shm registration (and transfer) works beside bob's full queue
        async with client(proc, people["alice"], "limits") as c:
            await c.put_chunks(keys, make_chunks(layout, 2, seed=3), layout)
            return (await c.fetch(keys, layout, "shm"))[1].transport

    assert run(alice_shm_fetch()) == "shm"
