"""A drain that times out stops every kv-get still running: served here, or through other nodes (a cluster's delegate)."""

from __future__ import annotations

import asyncio
import threading

from inprocess import InProcessNode, gated_node
from kvsupport import client, keys_for, make_chunks, run
from support import boto_client

N = 4


class HoldingDelegate:
    """Takes every kv-get (accepts it, as the cluster's peer path does) and then holds it until cancelled."""

    def __init__(self) -> None:
        self.accepted, self.cancelled = threading.Event(), threading.Event()

    async def delegate(self, tenant, bucket, request_id, d, transport, accept):
        accept()
        self.accepted.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return None


def _stop_while(node: InProcessNode, held: threading.Event, tenant, layout, keys, chunks, bucket: str) -> BaseException | None:
    """A kv-get from a thread; once ``held`` is set the node's transfers are stopped; what the kv-get raised."""
    outcome: list[BaseException | None] = []

    async def fetch() -> None:
        async with client(node, tenant, bucket) as c:
            await c.put_chunks(keys, chunks, layout)
            try:
                await c.fetch(keys, layout, "shm", mode="layerwise")
                outcome.append(None)
            except Exception as e:  # noqa: BLE001 - the test looks at what the cut kv-get raised
                outcome.append(e)

    thread = threading.Thread(target=lambda: run(fetch()))
    thread.start()
    assert held.wait(30), "the kv-get never reached the point where it is held"
    kv = node.storage_server.kv
    assert len(kv.active) == 1
    asyncio.run_coroutine_threadsafe(kv.stop_transfers(), node._loop).result(30)
    thread.join(60)
    assert not thread.is_alive() and kv.active == {} and kv._tasks == {}
    return outcome[0]


def test_a_kv_get_served_here_is_stopped(tmp_path):
    tenant, layout, gate, node = gated_node(tmp_path, "l")
    try:
        boto_client(node.endpoint, tenant).create_bucket(Bucket="local")
        gate.hold_before(1)
        error = _stop_while(node, gate.held, tenant, layout, keys_for(layout, N, "local"), make_chunks(layout, N, seed=1), "local")
        assert error is not None, "the stopped kv-get did not complete"
    finally:
        gate.open()
        node.stop()


def test_a_kv_get_served_through_other_nodes_is_stopped_too(tmp_path):
    """The delegate accepted it and holds it: stop_transfers cancels it as it does a local one (it used to be left
    running, only local transfers were known to it), the delegate sees the cancel, nothing stays active."""
    tenant, layout, _, node = gated_node(tmp_path, "d")
    delegate = HoldingDelegate()
    node.storage_server.kv.delegate = delegate
    try:
        boto_client(node.endpoint, tenant).create_bucket(Bucket="delegated")
        error = _stop_while(node, delegate.accepted, tenant, layout, keys_for(layout, N, "delegated"), make_chunks(layout, N, seed=2),
                            "delegated")
        assert delegate.cancelled.is_set() and error is not None
    finally:
        node.stop()
