"""Over shm the node decodes the next layer while this one decodes; the LAYER frames stay in order and exact, and a
client that leaves mid-load leaves no decode writing into its memory."""

from __future__ import annotations

import asyncio

import numpy as np
from compressionsupport import kv_chunks, kv_layout
from inprocess import InProcessNode
from kvsupport import client, keys_for, reference, run
from support import boto_client, make_tenants, write_config

N = 6


def _node(tmp_path):
    tenant = make_tenants("z")[0]
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra=(
        f'\n[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\ntheta_bytes = 0\n'
        '[compression]\ndecode_on_put = false\ndecoded_copies_bytes = 0\n'))  # every kv-get decodes in the node
    node = InProcessNode(config).start()
    boto_client(node.endpoint, tenant).create_bucket(Bucket="ahead")
    return tenant, node


def _record_decodes(node: InProcessNode, hold_from: int | None = None) -> list[tuple[str, int]]:
    """("start"/"end", layer) of every layer decode, in the order the node's loop saw them; ``hold_from``: layers from
    that one on wait until cancelled instead of decoding."""
    decoder = node.storage_server.kv.executor.decoder
    real, events = decoder.decode, []

    async def decode(fds, offsets, headers, keys, layer, *rest):
        events.append(("start", layer))
        try:
            if hold_from is not None and layer >= hold_from:
                await asyncio.sleep(3600)
            return await real(fds, offsets, headers, keys, layer, *rest)
        finally:
            events.append(("end", layer))
    decoder.decode = decode
    return events


def test_the_next_layer_decodes_while_this_one_does_and_the_layers_arrive_in_order(tmp_path):
    tenant, node = _node(tmp_path)
    try:
        events = _record_decodes(node)
        layout = kv_layout(16)
        chunks, keys = kv_chunks(layout, N, seed=80), keys_for(layout, N, "ahead")

        async def go():
            async with client(node, tenant, "ahead") as c:
                await c.put_chunks(keys, chunks, layout, codec="zstd")
                got = []
                async with c.fetch_layers(keys, layout, "shm", mode="layerwise") as layers:
                    async for layer, view in layers:
                        got.append((layer, bytes(view)))
                return got
        got = run(go())
        expected = reference(layout, chunks)
        assert [layer for layer, _ in got] == list(range(layout.num_layers))
        assert all(view == expected[layer].tobytes() for layer, view in got)
        # layer 1's decode began before layer 0's ended (later ones top up as frames go out: with layers this small
        # one may be done before the next starts); never more than two at once
        assert events.index(("start", 1)) < events.index(("end", 0)), events
        running, most = 0, 0
        for kind, _ in events:
            running += 1 if kind == "start" else -1
            most = max(most, running)
        assert most == 2 and running == 0
    finally:
        node.stop()


def test_a_client_that_leaves_mid_load_leaves_no_decode_running(tmp_path):
    """Layers from 1 on never finish decoding (held); the client takes layer 0 and leaves: the node's transfer is cut,
    the layer decoding ahead is cancelled and waited for, and no decode ends after the transfer has returned."""
    tenant, node = _node(tmp_path)
    try:
        events = _record_decodes(node, hold_from=1)
        executor = node.storage_server.kv.executor
        real_run = executor.run

        async def run_recorded(*args, **kwargs):
            try:
                return await real_run(*args, **kwargs)
            finally:
                events.append(("returned", -1))
        executor.run = run_recorded
        layout = kv_layout(16)
        chunks, keys = kv_chunks(layout, N, seed=81), keys_for(layout, N, "leave")
        completed = node.storage_server.kv.completed

        async def go():
            async with client(node, tenant, "ahead") as c:
                await c.put_chunks(keys, chunks, layout, codec="zstd")
                async with c.fetch_layers(keys, layout, "shm", mode="layerwise") as layers:
                    async for layer, view in layers:
                        assert layer == 0 and np.array_equal(np.frombuffer(view, np.uint8), reference(layout, chunks)[0])
                        break  # leaves: the fetch is abandoned
        run(go())

        async def settled():
            for _ in range(500):  # bounded: the node notices the closed connection
                if ("returned", -1) in events and not node.storage_server.kv.active:
                    return True
                await asyncio.sleep(0.01)
            return False
        assert asyncio.run_coroutine_threadsafe(settled(), node._loop).result(30)
        assert ("start", 1) in events and ("end", 1) in events, events  # layer 1 was held, then cancelled
        assert events.index(("returned", -1)) == len(events) - 1, events  # nothing ended after the transfer returned
        assert node.storage_server.kv.completed == completed  # cut, not completed
    finally:
        node.stop()
