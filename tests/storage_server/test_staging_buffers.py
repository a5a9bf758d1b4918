"""http staging is kept between kv-gets: the same tenant's next kv-get reuses buffers already faulted in, no tenant is
handed a buffer another tenant's bytes were staged in, and a buffer the socket may still send from is never kept."""

from __future__ import annotations

import numpy as np
from kvsupport import client, keys_for, make_chunks, reference, rpc, run, tiny_layout
from support import boto_client

from storage_server.staging_buffers import ROUND, StagingBuffers
from storage_server.transports.base import FrameSink
from storage_server.transports.http import HttpTransport


def test_a_kept_buffer_goes_back_only_to_its_tenant_and_the_oldest_go_past_the_bound():
    kept = StagingBuffers(max_idle_bytes=3 * ROUND)
    a = kept.take("alice", 100)
    assert len(a) == ROUND  # whole MiB: nearby shapes share buffers
    kept.give("alice", a)
    assert kept.take("bob", 100) is not a  # bob gets a new one, never alice's
    assert kept.take("alice", 200) is a
    b, c, d = (kept.take("alice", ROUND) for _ in range(3))
    for buf in (a, b, c, d):
        kept.give("alice", buf)
    assert kept.idle_bytes == 3 * ROUND  # a, the oldest, was dropped
    assert {id(kept.take("alice", ROUND)) for _ in range(3)} == {id(b), id(c), id(d)}
    assert kept.take("alice", 2 * ROUND) is not None and kept.status()["reused"] == 4


class QueuedWriter:
    """Stands in for the RPC stream's writer: ``queued`` bytes still wait for the socket."""

    def __init__(self, queued: int) -> None:
        self.transport = self
        self._queued = queued

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return self._queued


def test_a_transfer_that_ended_with_bytes_queued_keeps_none_of_its_buffers():
    for queued, kept_after in ((0, 2), (4096, 0)):
        kept = StagingBuffers()
        transport = HttpTransport(FrameSink(QueuedWriter(queued)), 0, 4096, 4, 2, tenant="alice", kept=kept)  # type: ignore[arg-type]
        transport.piece_buffer(0, 0, 4)
        transport.piece_buffer(1, 0, 4)
        transport.close()
        assert kept.status()["idle"] == kept_after


def test_http_kv_gets_reuse_their_tenants_staging_byte_exact(server, tenants):
    layout = tiny_layout(256, num_layers=4)
    n = 64
    status = lambda: rpc(server.rpc_socket, "status")["http_staging"]["kept"]  # noqa: E731

    async def scenario() -> None:
        fetched = {}
        for name in ("alice", "bob"):
            bucket = f"staging-kept-{name}"
            boto_client(server.endpoint, tenants[name]).create_bucket(Bucket=bucket)
            keys, chunks = keys_for(layout, n, bucket), make_chunks(layout, n, seed=len(name))
            async with client(server, tenants[name], bucket) as c:
                await c.put_chunks(keys, chunks, layout)
            fetched[name] = (bucket, keys, reference(layout, chunks))
        before = status()
        for _ in range(3):  # alternating tenants: each reuses its own staging, never the other's
            for name, (bucket, keys, want) in fetched.items():
                async with client(server, tenants[name], bucket) as c:
                    payload, _ = await c.fetch(keys, layout, "http", mode="layerwise")
                assert np.array_equal(payload, want)
        after = status()
        assert after["reused"] - before["reused"] >= 8, (before, after)  # 2 buffers a kv-get, all but the first per tenant
        assert after["idle_bytes"] <= 64 << 20

    run(scenario())
