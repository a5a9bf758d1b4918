"""Registered shm regions are bounded by declared size, per tenant and in total, whatever their residency.

A sealed sparse memfd costs no memory but its whole size of the storage server's address space:
bob registering 2⁴⁴–2⁴⁵-byte ones exhausted its 128 TiB and other tenants' kv-puts failed 503.
Every region here is sparse (never touched), so only the declared sizes can be what is counted.
"""

from __future__ import annotations

import json

import pytest
from kvsupport import rpc
from rawhttp import signed
from support import ServerProcess, make_tenants, write_config

from client_sdk.buffers import ShmRegion, hand_over

MiB = 1 << 20


def ask(server, tenant, size: int):
    return signed(server.endpoint, tenant, "POST", "/?kv-register", body=json.dumps({"size": size}).encode())


def ticket(server, tenant, size: int) -> dict:
    r = ask(server, tenant, size)
    assert r.status == 200, r.body
    return json.loads(r.body)


def redeem(t: dict) -> dict:
    region = ShmRegion(t["size"])
    try:
        return hand_over(t["socket"], bytes.fromhex(t["ticket"]), region.fd)
    finally:
        region.close()


def test_a_region_larger_than_a_tenant_may_hold_is_refused_by_default(server, tenants):
    r = ask(server, tenants["bob"], 1 << 44)  # 16 TiB: the audit's sparse memfd
    assert r.status == 400 and b"InvalidArgument" in r.body and b"<ArgumentName>size</ArgumentName>" in r.body, r.body
    assert b"storage_server.shm_max_bytes_per_tenant" in r.body


@pytest.fixture
def node(tmp_path):
    people = {t.name: t for t in make_tenants("alice", "bob")}
    config = write_config(tmp_path / "c.toml", tmp_path / "data", list(people.values()),
                          extra=f'\n[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\n'
                                f"shm_max_bytes_per_tenant = {1024 * MiB}\nshm_max_bytes = {1536 * MiB}\n")
    proc = ServerProcess(config).start()
    proc.rpc_socket = str(tmp_path / "ss.sock")
    yield proc, people
    proc.stop()


def test_declared_bytes_are_bounded_per_tenant_and_in_total(node):
    proc, people = node
    alice, bob = people["alice"], people["bob"]
    r = ask(proc, bob, 1025 * MiB)
    assert r.status == 400 and b"<ArgumentName>size</ArgumentName>" in r.body, r.body
    # Pending tickets count: two of 512 MiB fill bob's share before any memory is handed over.
    first, second = ticket(proc, bob, 512 * MiB), ticket(proc, bob, 512 * MiB)
    r = ask(proc, bob, 4096)
    assert r.status == 503 and b"storage_server.shm_max_bytes_per_tenant" in r.body, r.body
    redeemed = [redeem(first), redeem(second)]
    assert rpc(proc.rpc_socket, "status")["regions"] == 2
    # Bob's own idle regions make room for his next one: the least recently used goes.
    redeem(ticket(proc, bob, 512 * MiB))
    assert rpc(proc.rpc_socket, "status")["regions"] == 2
    gone = signed(proc.endpoint, bob, "POST", "/?kv-unregister",
                  body=json.dumps({"region_id": redeemed[0]["region_id"], "token": redeemed[0]["token"]}).encode())
    assert gone.status == 404 and b"KVNoSuchRegion" in gone.body, gone.body
    # Bob holds 1 GiB of the 1.5 GiB in total; alice gets the rest, and never room made from bob's regions.
    ticket(proc, alice, 512 * MiB)
    r = ask(proc, alice, 4096)
    assert r.status == 503 and b"storage_server.shm_max_bytes" in r.body and b"per_tenant" not in r.body, r.body
    assert rpc(proc.rpc_socket, "status")["regions"] == 2
