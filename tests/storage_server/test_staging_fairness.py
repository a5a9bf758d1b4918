"""One tenant cannot hold the whole http staging budget (security audit round two, item 6: 32 unread
32 MiB kv-gets held it all and another tenant's 4 KiB kv-get waited over a minute).

Each tenant's transfers hold at most ``storage_server.http_staging_tenant_share`` of the budget, and a
transfer whose receiver takes no bytes for ``storage_server.send_stall_s`` is cut and releases its staging.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from urllib.parse import urlsplit

import numpy as np
from inprocess import InProcessNode
from kvsupport import client, keys_for, make_chunks, reference, rpc, run, tiny_layout
from rawhttp import sign
from support import ServerProcess, boto_client, make_tenants, write_config

from client_sdk import KVLayout
from protocol.wire import Descriptor, Target, TransportKind, encode_descriptor
from storage_server.kv_service import TransferInfo


class TenantGate:
    """A pacer factory holding every transfer of one tenant before its second layer until released."""

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        self.held = 0
        self.release = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, info: TransferInfo):
        return _Hold(self) if info.tenant == self.tenant else None


class _Hold:
    def __init__(self, gate: TenantGate) -> None:
        self.gate, self.layer = gate, 0

    async def before_layer(self, nbytes: int) -> None:
        if self.layer == 1:
            with self.gate._lock:
                self.gate.held += 1
            deadline = time.monotonic() + 60  # bounded: a forgotten gate cannot hang the suite
            while not self.gate.release.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
        self.layer += 1

    def after_layer(self) -> None:
        pass


def wait_until(predicate, what: str, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"never: {what}")


def test_one_tenants_held_transfers_leave_room_for_another_tenant(tmp_path):
    layout = tiny_layout(16, num_layers=4)  # S = 32 bytes
    n = 64  # a layer is 2 KiB
    alice, bob = make_tenants("alice", "bob")
    sock = tmp_path / "ss.sock"
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [alice, bob], extra=(
        f'\n[storage_server]\nsocket = "{sock}"\nhttp_staging_bytes = {2 * n * layout.per_layer_chunk_bytes}\n'))
    gate = TenantGate("bob")
    node = InProcessNode(config, pacers=[gate]).start()
    try:
        for tenant, bucket in ((alice, "fair-a"), (bob, "fair-b")):
            boto_client(node.endpoint, tenant).create_bucket(Bucket=bucket)
        keys, chunks = keys_for(layout, n, "fair"), make_chunks(layout, n, seed=2)

        async def scenario():
            async with client(node, bob, "fair-b") as b, client(node, alice, "fair-a") as a:
                await b.put_chunks(keys, chunks, layout)
                await a.put_chunks(keys, chunks, layout)
                held = [asyncio.ensure_future(b.fetch(keys, layout, "http", mode="layerwise")) for _ in range(3)]
                while gate.held < 1:  # bob's first transfer holds its staging, the others wait for bob's share
                    await asyncio.sleep(0.02)
                # Alice's kv-get runs now, beside bob's held ones (before: it waited behind them).
                payload, _ = await asyncio.wait_for(a.fetch(keys, layout, "http", mode="layerwise"), 60)
                assert np.array_equal(payload, reference(layout, chunks))
                assert gate.held == 1, "bob's further transfers must wait for his own share"
                gate.release.set()
                for done in await asyncio.gather(*held):
                    assert np.array_equal(done[0], reference(layout, chunks))
                assert rpc(str(sock), "status")["http_staging"]["held_bytes"] == 0

        run(scenario())
    finally:
        gate.release.set()
        node.stop()


def test_a_transfer_whose_client_stops_reading_is_cut_and_releases_its_staging(tmp_path):
    layout = KVLayout(num_layers=1, chunk_tokens=64, kv_heads=8, head_dim=128, dtype="uint8")  # S = 128 KiB
    n = 256  # a 32 MiB layer of one chunk repeated: far more than every socket buffer on the way
    alice, bob = make_tenants("alice", "bob")
    sock = tmp_path / "ss.sock"
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [alice, bob], extra=(
        f'\n[storage_server]\nsocket = "{sock}"\nhttp_staging_bytes = {4 << 20}\nsend_stall_s = 1.0\n'))
    proc = ServerProcess(config).start()
    try:
        for tenant in (alice, bob):
            boto_client(proc.endpoint, tenant).create_bucket(Bucket=f"stall-{tenant.name}")
        key, chunk = keys_for(layout, 1, "stall")[0], make_chunks(layout, 1, seed=4)[0]

        async def put(tenant):
            async with client(proc, tenant, f"stall-{tenant.name}") as c:
                await c.put_chunks([key], [chunk], layout)

        run(put(alice))
        run(put(bob))
        body = encode_descriptor(Descriptor([key] * n, 1, layout.chunk_tokens, layout.per_layer_chunk_bytes,
                                            Target(TransportKind.HTTP, length=n * layout.chunk_bytes)))
        u = urlsplit(proc.endpoint)
        path = "/stall-bob?kv-get"
        headers = sign(bob, "POST", f"http://{u.netloc}{path}", {"Content-Length": str(len(body))}, body)
        silent = socket.socket()
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and it never reads
        silent.connect((u.hostname, u.port))
        try:
            silent.sendall(f"POST {path} HTTP/1.1\r\n".encode() + "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode()
                           + b"\r\n" + body)
            status = lambda: rpc(str(sock), "status")  # noqa: E731
            wait_until(lambda: status()["http_staging"]["held_bytes"] > 0, "bob's transfer holds staging")
            wait_until(lambda: status()["http_staging"]["held_bytes"] == 0 and not status()["transfers_active"],
                       "the stalled transfer was cut and its staging released")
        finally:
            silent.close()

        async def fetch():
            async with client(proc, alice, "stall-alice") as c:
                return await c.fetch([key] * 4, layout, "http")

        payload, _ = run(fetch())
        assert np.array_equal(payload, reference(layout, [chunk] * 4))
    finally:
        proc.stop()
