"""NIXL metadata from a client must lead to that client's memory, and no remote operation may hang.

The audit rewrote the UCX port in a client's NIXL metadata: the storage server connected to whatever
listened there and the kv-get hung for good. Now a registration proves itself: the client writes a
random proof at the start of its memory and the storage server READs it back through the agent the
metadata describes, within storage_server.rdma_timeout_s, before anything is written — metadata
pointing at a port that never answers, or at another client's agent, is refused. Every write is
bounded by the same timeout. The storage server's UCX uses TCP only here (as between hosts), so the
rewritten port is what it must connect to.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct
import threading

import numpy as np
import pytest
from kvsupport import keys_for, make_chunks, reference, run, tiny_layout
from rawhttp import signed
from support import ServerProcess, boto_client, make_tenants, write_config

from client_sdk import ObjectCacheClient, ObjectCacheError
from client_sdk.rdma import NixlClient, rdma_available
from protocol.errors import ErrorCode, S3Error

pytestmark = pytest.mark.skipif(not rdma_available()[0], reason=f"rdma transport unavailable here: {rdma_available()[1]}")
LAYOUT = tiny_layout(16, num_layers=4)


def listening_tcp_ports() -> list[int]:
    """TCP ports this process listens on (its UCX workers' among them)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            f = line.split()
            if f[9] in inodes and f[3] == "0A":
                ports.append(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def misdirect(md: bytes, port: int) -> bytes:
    """``md`` with every UCX TCP port of this process in it replaced by ``port``."""
    ucx, found = md.index(b"UCX|c"), 0
    for mine in listening_tcp_ports():
        at = md.find(struct.pack(">H", mine), ucx)
        if at >= 0:
            md, found = md[:at] + struct.pack(">H", port) + md[at + 2:], found + 1
    assert found, "no UCX port found in the metadata to rewrite"
    return md


@pytest.fixture
def black_hole():
    """A loopback port that accepts connections and never says a word."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(hole.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield hole.getsockname()[1]
    hole.close()
    for c in held:
        c.close()


@pytest.fixture
def node(tmp_path):
    people = {t.name: t for t in make_tenants("alice", "bob")}
    config = write_config(tmp_path / "c.toml", tmp_path / "data", list(people.values()),
                          extra=f'\n[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\nrdma_timeout_s = 1\n')
    proc = ServerProcess(config, env={"UCX_TLS": "tcp"}).start()
    yield proc, people
    proc.stop()


def test_metadata_pointing_at_a_port_that_never_answers_is_refused_at_registration(node, monkeypatch, black_hole):
    proc, people = node
    alice = people["alice"]
    honest = NixlClient.metadata
    boto_client(proc.endpoint, alice).create_bucket(Bucket="hole")
    keys, chunks = keys_for(LAYOUT, 8, "hole"), make_chunks(LAYOUT, 8, seed=2)

    async def scenario():
        async with ObjectCacheClient(proc.endpoint, alice.access_key, alice.secret_key, "hole", read_timeout=20) as c:
            await c.put_chunks(keys, chunks, LAYOUT)
            monkeypatch.setattr(NixlClient, "metadata", lambda self: misdirect(honest(self), black_hole))
            with pytest.raises(ObjectCacheError) as e:
                await c.fetch(keys, LAYOUT, "rdma")
            assert e.value.code is ErrorCode.InvalidArgument and e.value.extra.get("ArgumentName") == "agent", e.value
            assert "storage_server.rdma_timeout_s" in e.value.message
            monkeypatch.setattr(NixlClient, "metadata", honest)
            payload, stats = await c.fetch(keys, LAYOUT, "rdma")  # the misdirected agent was forgotten: honest metadata loads
            assert stats.transport == "rdma" and np.array_equal(payload, reference(LAYOUT, chunks))

    run(scenario())


def test_another_clients_agent_and_memory_cannot_be_registered(node):
    """Bob replays alice's metadata under a new agent name, naming her memory: his kv-gets would write into it."""
    proc, people = node
    alice = NixlClient()
    buf = np.zeros(1 << 16, np.uint8)
    buf[:16] = np.frombuffer(os.urandom(16), np.uint8)  # alice's own proof, which bob does not know
    handle = alice.register(buf)
    try:
        name = alice.agent.name.encode()
        md = alice.metadata().replace(name, name[:-4] + b"bob!")
        body = {"engine": "nixl", "agent": base64.b64encode(md).decode(), "addr": buf.ctypes.data, "size": buf.nbytes,
                "proof": bytes(16).hex()}
        r = signed(proc.endpoint, people["bob"], "POST", "/?kv-register-rdma", body=json.dumps(body).encode())
        assert r.status == 400 and b"<ArgumentName>proof</ArgumentName>" in r.body and b"does not hold the proof" in r.body, r.body
        assert not buf[16:].any()
    finally:
        alice.deregister(handle)


def test_a_write_that_never_completes_is_cut_and_breaks_the_link(monkeypatch, black_hole):
    """The storage server's engine itself (TCP only), writing through metadata that leads to the black hole."""
    from storage_server.transports.nixl_engine import NixlEngine, NixlLink

    client = NixlClient()
    remote = np.zeros(4096, np.uint8)
    remote_handle = client.register(remote)
    monkeypatch.setenv("UCX_TLS", "tcp")
    engine = NixlEngine(f"test-engine-{os.getpid()}", timeout_s=0.5)
    name = engine.add_client(misdirect(client.metadata(), black_hole), "t")
    link = NixlLink(engine, name, remote.ctypes.data, remote.nbytes)
    staging = np.ones(64, np.uint8)
    handle = link.register(staging)
    try:
        with pytest.raises(S3Error) as e:
            asyncio.run(asyncio.wait_for(link.write(staging, handle, 0), 30))
        assert e.value.code is ErrorCode.ServiceUnavailable and "storage_server.rdma_timeout_s" in e.value.message
        assert link.broken and not remote.any()
    finally:
        link.deregister(handle)
        link.close()
        client.deregister(remote_handle)
