"""shm registration is a hand-over of memory the client created: no tenant can crash the storage server
or make it write into memory the tenant did not hand over itself (security audit, defects 1 and 2)."""

from __future__ import annotations

import json
import os
import secrets
import threading

import numpy as np
import pytest
from kvsupport import client, keys_for, make_chunks, reference, rpc, run, tiny_layout
from rawhttp import signed

from client_sdk.buffers import ShmRegion, hand_over
from protocol.errors import S3Error
from protocol.wire import Descriptor, Target, TransportKind, encode_descriptor

LAYOUT = tiny_layout(16, num_layers=8)
N = 64


@pytest.fixture(scope="module")
def stored(server, tenants, s3):
    bucket = "kv-shm-security"
    s3.create_bucket(Bucket=bucket)
    keys, chunks = keys_for(LAYOUT, N, "shm-sec"), make_chunks(LAYOUT, N, seed=21)

    async def put():
        async with client(server, tenants["alice"], bucket) as c:
            await c.put_chunks(keys, chunks, LAYOUT)

    run(put())
    return bucket, keys, chunks


def ticket_for(server, tenant, size: int) -> dict:
    r = signed(server.endpoint, tenant, "POST", "/?kv-register", body=json.dumps({"size": size}).encode())
    assert r.status == 200, r.body
    return json.loads(r.body)


def register_by_hand(server, tenant, fd: int, size: int) -> dict:
    """Both registration steps without the SDK, keeping our own descriptor of the memory."""
    t = ticket_for(server, tenant, size)
    return hand_over(t["socket"], bytes.fromhex(t["ticket"]), fd)


def test_a_client_resizing_its_region_during_transfers_cannot_crash_the_storage_server(server, tenants, stored):
    """The attacker keeps a descriptor of its registered memory and loops ftruncate(small)/ftruncate(size)
    while kv-gets write into it: the memory cannot shrink, every transfer is byte-exact, the server lives."""
    bucket, keys, chunks = stored
    size = LAYOUT.payload_bytes(N)
    region = ShmRegion(size)
    attacker_fd = os.dup(region.fd)
    reply = register_by_hand(server, tenants["alice"], region.fd, region.size)
    region.handed_over()
    pid = rpc(server.rpc_socket, "status")["pid"]
    stop, refused = threading.Event(), []

    def resize_forever() -> None:
        while not stop.is_set():
            try:
                os.ftruncate(attacker_fd, 4096)
            except PermissionError:
                refused.append(1)
            os.ftruncate(attacker_fd, region.size)

    resizer = threading.Thread(target=resize_forever, daemon=True)
    resizer.start()
    try:
        target = Target(TransportKind.SHM, bytes.fromhex(reply["region_id"]), bytes.fromhex(reply["token"]), 0, size)
        body = encode_descriptor(Descriptor(keys, LAYOUT.num_layers, LAYOUT.chunk_tokens, LAYOUT.per_layer_chunk_bytes, target))
        expected = reference(LAYOUT, chunks).reshape(-1)
        for i in range(40):
            region.view[:size] = bytes(size)
            r = signed(server.endpoint, tenants["alice"], "POST", f"/{bucket}?kv-get", body=body)
            assert r.status == 200 and b'"payload_bytes"' in r.body, f"transfer {i}: {r.status} {r.body[-300:]!r}"
            assert np.array_equal(np.frombuffer(region.view[:size], np.uint8), expected), f"transfer {i} is not byte-exact"
    finally:
        stop.set()
        resizer.join(10)
        os.close(attacker_fd)
    assert refused, "shrinking the registered memory was never attempted"
    assert rpc(server.rpc_socket, "status")["pid"] == pid, "the storage server restarted"


def test_memory_that_is_not_a_sealed_memfd_is_refused_and_the_server_writes_nothing(server, tenants):
    """The old way to attack: register another program's /dev/shm file by name. Names are not accepted at all,
    and a descriptor of such a file handed over is refused without saying anything about the file."""
    victim_path = f"/dev/shm/victim-{secrets.token_hex(6)}"
    fd = os.open(victim_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, 1 << 20)
        r = signed(server.endpoint, tenants["bob"], "POST", "/?kv-register",
                   body=json.dumps({"name": os.path.basename(victim_path), "size": 1 << 20, "nonce": "00" * 16}).encode())
        assert r.status == 400 and b"InvalidArgument" in r.body and b"name" in r.body
        with pytest.raises(S3Error) as e:
            register_by_hand(server, tenants["bob"], fd, 1 << 20)
        assert e.value.code.name == "InvalidArgument" and "sealed" in e.value.message
        assert str(1 << 20) not in e.value.message and "victim" not in e.value.message
        assert os.pread(fd, 1 << 20, 0) == bytes(1 << 20)
    finally:
        os.close(fd)
        os.unlink(victim_path)


def test_a_ticket_cannot_be_used_by_someone_else_or_twice(server, tenants, stored, s3_bob):
    """Bob holding alice's real ticket can hand memory over, but the region is alice's: bob's kv-get into it
    (for bob's own bucket, holding bob's bytes under the same keys) is refused and writes nothing, while
    alice's fills it. A ticket works once; a guessed one never."""
    bucket, keys, chunks = stored
    size = LAYOUT.payload_bytes(N)
    bobs_bucket, bobs_chunks = "kv-shm-security-bob", make_chunks(LAYOUT, N, seed=22)
    s3_bob.create_bucket(Bucket=bobs_bucket)

    async def bob_puts():
        async with client(server, tenants["bob"], bobs_bucket) as c:
            await c.put_chunks(keys, bobs_chunks, LAYOUT)

    run(bob_puts())
    t = ticket_for(server, tenants["alice"], size)
    first, second = ShmRegion(size), ShmRegion(size)
    try:
        reply = hand_over(t["socket"], bytes.fromhex(t["ticket"]), first.fd)  # handed over by whoever holds the ticket
        assert set(reply) == {"region_id", "token", "size"} and reply["size"] == size
        target = Target(TransportKind.SHM, bytes.fromhex(reply["region_id"]), bytes.fromhex(reply["token"]), 0, size)
        body = encode_descriptor(Descriptor(keys, LAYOUT.num_layers, LAYOUT.chunk_tokens, LAYOUT.per_layer_chunk_bytes, target))
        r = signed(server.endpoint, tenants["bob"], "POST", f"/{bobs_bucket}?kv-get", body=body)
        assert r.status == 403 and b"AccessDenied" in r.body, r.body
        assert bytes(first.view[:size]) == bytes(size)  # nothing of bob's was written
        r = signed(server.endpoint, tenants["alice"], "POST", f"/{bucket}?kv-get", body=body)
        assert r.status == 200, r.body  # the ticket's tenant owns the region
        assert np.array_equal(np.frombuffer(first.view[:size], np.uint8), reference(LAYOUT, chunks).reshape(-1))
        with pytest.raises(S3Error) as e:
            hand_over(t["socket"], bytes.fromhex(t["ticket"]), second.fd)
        assert e.value.code.name == "AccessDenied"
        with pytest.raises(S3Error) as e:
            hand_over(t["socket"], secrets.token_bytes(32), second.fd)
        assert e.value.code.name == "AccessDenied"
    finally:
        first.close()
        second.close()
