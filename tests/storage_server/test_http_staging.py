"""The daemon's memory for http transfers is bounded: transfers wait for staging room, big chunkwise ones go layerwise."""

from __future__ import annotations

import asyncio
import time

import numpy as np
from inprocess import InProcessNode, LayerGate
from kvsupport import client, keys_for, make_chunks, reference, rpc, run, tiny_layout
from support import boto_client, make_tenants, serving, write_config

from client_sdk import KVLayout
from storage_server.staging import StagingBudget


def test_a_transfer_waits_until_its_staging_fits_and_an_oversized_one_runs_alone():
    async def scenario():
        budget = StagingBudget(100)
        order: list[str] = []

        async def transfer(name: str, nbytes: int, gate: asyncio.Event | None = None) -> None:
            async with budget.hold(nbytes):
                order.append(f"{name} starts")
                if gate is not None:
                    await gate.wait()
                order.append(f"{name} ends")

        gate = asyncio.Event()
        first = asyncio.ensure_future(transfer("a", 60, gate))
        await asyncio.sleep(0)
        others = [asyncio.ensure_future(transfer("b", 60)), asyncio.ensure_future(transfer("huge", 10_000))]
        await asyncio.sleep(0.01)
        assert order == ["a starts"] and budget.status() == {"total_bytes": 100, "held_bytes": 60, "transfers_waiting": 2}
        gate.set()
        await asyncio.gather(first, *others)
        assert order[:2] == ["a starts", "a ends"] and sorted(order[2:]) == sorted(["b starts", "b ends", "huge starts", "huge ends"])
        assert budget.status()["held_bytes"] == 0

        # A transfer whose client leaves while it waits takes nothing with it.
        blocker = asyncio.Event()
        holder = asyncio.ensure_future(transfer("c", 100, blocker))
        await asyncio.sleep(0)
        waiter = asyncio.ensure_future(transfer("d", 1))
        await asyncio.sleep(0.01)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        blocker.set()
        await holder
        assert budget.status() == {"total_bytes": 100, "held_bytes": 0, "transfers_waiting": 0}

    asyncio.run(scenario())


def test_http_transfers_beyond_the_staging_budget_queue_and_a_big_chunkwise_one_goes_layerwise(tmp_path):
    layout = tiny_layout(16, num_layers=4)  # S = 32 bytes
    n = 64  # a layer is 2 KiB, the payload 8 KiB
    tenant = make_tenants("t")[0]
    sock = tmp_path / "ss.sock"
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra=(
        f'\n[storage_server]\nsocket = "{sock}"\nhttp_staging_bytes = {2 * n * layout.per_layer_chunk_bytes}\n'
        'http_staging_tenant_share = 1.0\n'))  # one tenant: the whole budget (per-tenant shares: test_staging_fairness)
    gate = LayerGate()
    proc = InProcessNode(config, pacers=[gate]).start()
    try:
        boto_client(proc.endpoint, tenant).create_bucket(Bucket="staging")
        keys, chunks = keys_for(layout, n, "staging"), make_chunks(layout, n, seed=9)
        expected = reference(layout, chunks)

        async def scenario():
            async with client(proc, tenant, "staging") as c:
                await c.put_chunks(keys, chunks, layout)
                payload, stats = await c.fetch(keys, layout, "http", mode="chunkwise")
                assert stats.server.mode == "layerwise" and np.array_equal(payload, expected)

                gate.hold_before(1)
                first = asyncio.ensure_future(c.fetch(keys, layout, "http", mode="layerwise"))
                assert await asyncio.to_thread(gate.wait_held)  # off the loop: the fetch must run
                deadline = time.monotonic() + 10
                second = asyncio.ensure_future(c.fetch(keys, layout, "http", mode="layerwise"))
                while rpc(str(sock), "status")["http_staging"]["transfers_waiting"] != 1 and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                staging = rpc(str(sock), "status")["http_staging"]
                assert staging["transfers_waiting"] == 1 and staging["held_bytes"] == staging["total_bytes"]
                gate.open()
                for done in await asyncio.gather(first, second):
                    assert np.array_equal(done[0], expected)
                assert rpc(str(sock), "status")["http_staging"]["held_bytes"] == 0

        run(scenario())
    finally:
        proc.stop()


def peak_rss_bytes(pid: int) -> int:
    """The process's high-water mark of resident memory (VmHWM)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


def test_http_staging_memory_stays_within_the_budget_however_large_a_layer_is(tmp_path):
    """A layer far larger than the staging budget (512 copies of one 128 KiB chunk key in one 64 MiB layer)
    is read and sent in pieces: the storage server's peak memory grows by about the budget, not by the layer
    (staging whole layers, two at a time, took 128 MiB here; the audit took a server to 3.4 GB this way)."""
    layout = KVLayout(num_layers=1, chunk_tokens=64, kv_heads=8, head_dim=128, dtype="uint8")  # S = 128 KiB
    n, budget = 512, 4 << 20
    with serving(tmp_path, http_staging_bytes=budget) as (proc, tenant, sock):
        boto_client(proc.endpoint, tenant).create_bucket(Bucket="big-layer")
        key, chunk = keys_for(layout, 1, "big-layer")[0], make_chunks(layout, 1, seed=11)[0]
        expected = reference(layout, [chunk] * n)
        pid = rpc(str(sock), "status")["pid"]

        async def scenario():
            async with client(proc, tenant, "big-layer") as c:
                await c.put_chunks([key], [chunk], layout)
                before = peak_rss_bytes(pid)
                for mode in ("layerwise", "chunkwise"):  # chunkwise is over the budget: sent layerwise
                    payload, stats = await c.fetch([key] * n, layout, "http", mode=mode)
                    assert stats.server.mode == "layerwise" and np.array_equal(payload, expected)
                grown = peak_rss_bytes(pid) - before
                assert grown < 4 * budget, f"the storage server's peak memory grew by {grown >> 20} MiB for a {budget >> 20} MiB budget"
                assert rpc(str(sock), "status")["http_staging"]["held_bytes"] == 0

        run(scenario())
