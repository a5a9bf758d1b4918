"""An RDMA write the client's side never completes is cut after storage_server.rdma_timeout_s.

The audit rewrote the UCX port in a client's NIXL metadata: the storage server connected to whatever
listened there and the kv-get hung for good. Here the port points at a socket that accepts and never
answers; the storage server's UCX uses TCP only (as between hosts), so the write must go there. The
kv-get must fail 503 naming the limit (before the client's own read timeout), and the region, now
broken, must be registered again — with honest metadata the next fetch then works.
"""

from __future__ import annotations

import os
import socket
import struct
import threading

import numpy as np
import pytest
from kvsupport import keys_for, make_chunks, reference, run, tiny_layout
from support import ServerProcess, boto_client, make_tenants, write_config

from client_sdk import ObjectCacheClient, ObjectCacheError
from client_sdk.rdma import NixlClient, rdma_available
from protocol.errors import ErrorCode

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


def test_a_write_to_a_peer_that_never_answers_is_cut_and_the_region_registered_again(tmp_path, monkeypatch, black_hole):
    tenant = make_tenants("t")[0]
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant],
                          extra=f'\n[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\nrdma_timeout_s = 1\n')
    proc = ServerProcess(config, env={"UCX_TLS": "tcp"}).start()
    honest = NixlClient.metadata
    rewritten = []

    def misdirected(self) -> bytes:
        md = honest(self)
        ucx = md.index(b"UCX|c")
        for port in listening_tcp_ports():
            at = md.find(struct.pack(">H", port), ucx)
            if at >= 0:
                md = md[:at] + struct.pack(">H", black_hole) + md[at + 2:]
                rewritten.append(port)
        return md

    try:
        boto_client(proc.endpoint, tenant).create_bucket(Bucket="hole")
        keys, chunks = keys_for(LAYOUT, 8, "hole"), make_chunks(LAYOUT, 8, seed=2)

        async def scenario():
            async with ObjectCacheClient(proc.endpoint, tenant.access_key, tenant.secret_key, "hole", read_timeout=20) as c:
                await c.put_chunks(keys, chunks, LAYOUT)
                monkeypatch.setattr(NixlClient, "metadata", misdirected)
                with pytest.raises(ObjectCacheError) as e:
                    await c.fetch(keys, LAYOUT, "rdma")
                assert rewritten, "no UCX port found in the metadata to rewrite"
                assert e.value.code is ErrorCode.ServiceUnavailable and "storage_server.rdma_timeout_s" in e.value.message, e.value
                monkeypatch.setattr(NixlClient, "metadata", honest)
                payload, stats = await c.fetch(keys, LAYOUT, "rdma")  # KVNoSuchRegion: the SDK registers afresh
                assert stats.transport == "rdma" and np.array_equal(payload, reference(LAYOUT, chunks))

        run(scenario())
    finally:
        proc.stop()
