"""A client that walks away stops the transfer and frees every server resource promptly."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from kvsupport import TRANSPORTS, client, keys_for, make_chunks, rpc, run, tiny_layout
from support import boto_client

from client_sdk import ObjectCacheClient, ObjectCacheError


def uncached_fds(status: dict) -> int:
    """Open fds other than the chunk files the open-file cache keeps between transfers."""
    return status["open_fds"] - status["open_file_cache"]["files"]


@pytest.mark.parametrize("transport", [*TRANSPORTS, "http-relay", "shm-relay"])
def test_leaving_early_frees_everything(gated_node, tenants, transport):
    """Over http both ways: from the data endpoint (this node has one) and relayed by the gateway; over shm both
    ways: through the local fast path (the SDK's default on the node's host) and through the gateway."""
    server, gate = gated_node, gated_node.gate
    bucket = f"kv-cancel-{transport}"
    transport, direct = transport.removesuffix("-relay"), not transport.endswith("-relay")
    boto_client(server.endpoint, tenants["alice"]).create_bucket(Bucket=bucket)
    layout = tiny_layout(16)
    keys = keys_for(layout, 500, f"cancel-{transport}")

    async def settled(before: dict) -> dict:
        """Poll (bounded) without blocking our event loop, which must close the socket."""
        deadline = time.monotonic() + 15
        while True:
            now = rpc(server.rpc_socket, "status")
            settled = not now["transfers_active"] and not now["open_file_cache"]["in_use"]
            if (settled and uncached_fds(now) <= uncached_fds(before)) or time.monotonic() > deadline:
                return now
            await asyncio.sleep(0.05)

    async def scenario():
        t = tenants["alice"]
        async with ObjectCacheClient(server.endpoint, t.access_key, t.secret_key, bucket=bucket, direct=direct,
                                     local_session=None if direct else False) as c:
            await c.put_chunks(keys, make_chunks(layout, 500, seed=5), layout)
            _, stats = await c.fetch(keys[:1], layout, transport)  # warm up: regions registered, connections open
            assert stats.direct == (direct and transport in ("http", "shm"))
            before = rpc(server.rpc_socket, "status")
            gate.hold_before(3)
            async with c.fetch_layers(keys, layout, transport=transport, mode="layerwise") as layers:
                async for idx, _ in layers:
                    assert gate.wait_held()
                    during = rpc(server.rpc_socket, "status")
                    assert len(during["transfers_active"]) == 1 and during["open_file_cache"]["in_use"] == 500
                    break  # walk away while the server is paused before layer 3
            after = await settled(before)
            assert after["transfers_active"] == [], "transfer still running after the client left"
            assert after["open_file_cache"]["in_use"] == 0, "chunk files still held by the abandoned transfer"
            assert uncached_fds(after) <= uncached_fds(before), "fds leaked"
            # The client can fetch again (into another region over shm: the abandoned one is retired).
            payload, _ = await c.fetch(keys[:10], layout, transport)
            assert payload.shape == (layout.num_layers, 10 * layout.per_layer_chunk_bytes)
        gate.open()

    run(scenario())


def test_a_stalled_stream_times_out_with_a_clear_error(gated_node, tenants):
    """read_timeout bounds silence, not transfer length: a server paused mid-stream raises RequestTimeout."""
    server, gate = gated_node, gated_node.gate
    bucket = "kv-stall"
    boto_client(server.endpoint, tenants["alice"]).create_bucket(Bucket=bucket)
    layout = tiny_layout(16)
    keys = keys_for(layout, 50, "stall")
    t = tenants["alice"]

    async def scenario():
        async with client(server, t, bucket) as writer:  # stored with the usual timeouts: a loaded machine took over 1 s to answer a put
            await writer.put_chunks(keys, make_chunks(layout, 50, seed=6), layout)
        async with ObjectCacheClient(server.endpoint, t.access_key, t.secret_key, bucket=bucket, read_timeout=3.0) as c:
            gate.hold_before(2)
            seen = []
            try:
                with pytest.raises(ObjectCacheError) as e:
                    async with c.fetch_layers(keys, layout, transport="http", mode="layerwise") as layers:
                        async for idx, _ in layers:
                            seen.append(idx)
            finally:
                gate.open()
            assert e.value.code.name == "RequestTimeout" and "read_timeout" in e.value.message
            assert seen == [0, 1]
            payload, _ = await c.fetch(keys, layout, "http")  # the client is still usable
            assert payload.shape == (layout.num_layers, 50 * layout.per_layer_chunk_bytes)

    run(scenario())


def test_kv_status_shows_a_tenant_its_own_transfers_and_nothing_of_the_host(gated_node, tenants):
    server, gate = gated_node, gated_node.gate
    bucket = "kv-status-own"
    boto_client(server.endpoint, tenants["alice"]).create_bucket(Bucket=bucket)
    layout = tiny_layout(16)
    keys = keys_for(layout, 40, "status-own")

    async def scenario():
        async with client(server, tenants["alice"], bucket) as alice, client(server, tenants["bob"], bucket) as bob:
            await alice.put_chunks(keys, make_chunks(layout, 40, seed=8), layout)
            gate.hold_before(1)
            try:
                async with alice.fetch_layers(keys, layout, transport="shm", mode="layerwise") as layers:
                    async for _ in layers:
                        assert await asyncio.to_thread(gate.wait_held)
                        mine, theirs = await alice.status(), await bob.status()
                        assert [t["tenant"] for t in mine["transfers_active"]] == ["alice"] and mine["regions"] == 1
                        assert theirs["transfers_active"] == [] and theirs["regions"] == 0
                        assert not {"data_dir", "pid", "open_fds", "transfers_completed"} & (set(mine) | set(theirs))
                        everything = rpc(server.rpc_socket, "status")  # the operator's view
                        assert len(everything["transfers_active"]) == 1 and "data_dir" in everything
                        break
            finally:
                gate.open()

    run(scenario())



def address(view) -> int:
    """Where a fetch's payload lies: two fetches into one region have the same."""
    return np.frombuffer(view, np.uint8).ctypes.data

def test_a_region_left_mid_transfer_is_never_lent_to_another_fetch(gated_node, tenants):
    """The server stops an abandoned transfer only at its next layer, and its read threads finish the piece they copy:
    the region it wrote into is retired (unregistered once the transfer lets go of it), never handed to the next fetch,
    whose layers the late pieces would otherwise overwrite."""
    server, gate = gated_node, gated_node.gate
    bucket = "kv-cancel-retire"
    boto_client(server.endpoint, tenants["alice"]).create_bucket(Bucket=bucket)
    layout = tiny_layout(16)
    keys = keys_for(layout, 200, "retire")

    async def scenario():
        async with client(server, tenants["alice"], bucket) as c:
            await c.put_chunks(keys, make_chunks(layout, 200, seed=9), layout)
            await c.fetch(keys[:1], layout, "shm")  # a region registered and idle
            regions = rpc(server.rpc_socket, "status")["regions"]
            gate.hold_before(3)
            async with c.fetch_layers(keys, layout, transport="shm", mode="layerwise") as layers:
                async for _ in layers:
                    assert gate.wait_held()
                    abandoned = address(layers.payload)
                    break
            gate.open()
            async with c.fetch_layers(keys[:10], layout, transport="shm", mode="layerwise") as again:
                async for _ in again:
                    pass
                assert address(again.payload) != abandoned, "the abandoned fetch's region was lent to the next one"
            deadline = time.monotonic() + 15
            while rpc(server.rpc_socket, "status")["regions"] != regions and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert rpc(server.rpc_socket, "status")["regions"] == regions, "the retired region was never unregistered"

    run(scenario())


def test_a_fetch_given_up_while_its_request_was_opening_retires_its_region(gated_node, tenants):
    """Past its client-side load budget before the node's answer, the kv-get may still have been accepted: its region is
    retired like one left mid-stream. One the node refused (NoSuchKey) wrote nothing, and its region is reused."""
    server = gated_node
    bucket = "kv-cancel-opening"
    boto_client(server.endpoint, tenants["alice"]).create_bucket(Bucket=bucket)
    layout = tiny_layout(16)
    keys = keys_for(layout, 50, "opening")

    async def fetched_into(c) -> int:
        async with c.fetch_layers(keys, layout, transport="shm", mode="layerwise") as layers:
            async for _ in layers:
                pass
            return address(layers.payload)

    async def scenario():
        async with client(server, tenants["alice"], bucket) as c:
            await c.put_chunks(keys, make_chunks(layout, 50, seed=10), layout)
            first = await fetched_into(c)
            assert await fetched_into(c) == first  # an idle region is reused
            with pytest.raises(ObjectCacheError) as e:
                await c.fetch([*keys[:5], "opening/not-stored"], layout, "shm")
            assert e.value.code.name == "NoSuchKey"
            assert await fetched_into(c) == first  # refused: nothing was written, the region stays in use
            with pytest.raises(ObjectCacheError) as e:
                await c.fetch(keys, layout, "shm", load_budget_s=1e-6)  # given up before the node could answer
            assert e.value.code.name == "KVLoadBudgetExceeded"
            assert await fetched_into(c) != first, "a region the node may still write into was lent to the next fetch"

    run(scenario())
