"""The pyverbs engine bounds every write in time: a peer that never completes one (a WRITE_WITH_IMM it
never posts a receive for is retried forever with rnr_retry 7) fails the transfer after
storage_server.rdma_timeout_s and breaks the queue pair, instead of holding the kv-get for good.

No RDMA device here: the fake NIC (tests/fakeverbs.py) is told to swallow the work requests."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from fakeverbs import Fabric
from test_verbs_engine import client_end

from client_sdk.verbs import VerbsBuffer
from protocol.errors import S3Error
from storage_server.transports.verbs_engine import VerbsEngine


@pytest.mark.parametrize("operation", ["write", "notify"])
def test_a_write_the_peer_never_completes_fails_after_the_timeout_and_breaks_the_link(operation):
    fabric = Fabric()
    device = fabric.device(1)
    engine = VerbsEngine(device, timeout_s=0.2)
    buf, mr, cq, link = client_end(fabric, 1024)
    conn, server_end = engine.connect(link.local(mr.rkey), buf.ctypes.data, buf.nbytes)
    link.connect(server_end)
    VerbsBuffer(buf, mr, link, cq, b"r", b"t")
    staging = np.ones(64, np.uint8)
    local = conn.register(staging)
    posted = []
    device.post_write = lambda *request: posted.append(request)  # accepted, never completed

    async def go():
        await (conn.write(staging, local, 0) if operation == "write" else conn.notify(1, 0))

    with pytest.raises(S3Error) as e:
        asyncio.run(asyncio.wait_for(go(), 30))
    assert e.value.code.name == "ServiceUnavailable" and "storage_server.rdma_timeout_s" in e.value.message
    assert posted and conn.broken
