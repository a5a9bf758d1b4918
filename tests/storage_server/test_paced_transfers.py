"""Layerwise transfers through a capped bandwidth pool: correct bytes, in layer order, allocation visible."""

from __future__ import annotations

import asyncio

import numpy as np
from inprocess import InProcessNode, LayerGate
from kvsupport import client, keys_for, make_chunks, reference, rpc, run, tiny_layout
from support import ServerProcess, boto_client, make_tenants, write_config


def test_three_paced_transfers_arrive_in_order_and_are_slowed_within_the_pool(tmp_path):
    """Three clients at once (whether the server ran them at the same time is shown by the gated test below)."""
    tenants = make_tenants("a", "b", "c")
    sock = tmp_path / "ss.sock"
    config = write_config(tmp_path / "c.toml", tmp_path / "data", tenants, extra=(
        f'\n[storage_server]\nsocket = "{sock}"\n'
        '\n[bandwidth]\ncapacity_gbps = 0.4\npolicy = "calibrated-stall-opt"\nmargin_gbps = 0.01\nepoch_ms = 5\n'))
    proc = ServerProcess(config).start()
    try:
        layout = tiny_layout(64)
        data = {}
        for i, t in enumerate(tenants):
            boto_client(proc.endpoint, t).create_bucket(Bucket=f"paced-{t.name}")
            data[t.name] = (keys_for(layout, 150 + 50 * i, f"p{i}"), make_chunks(layout, 150 + 50 * i, seed=20 + i))

        async def one(i, t, windows):
            keys, chunks = data[t.name]
            expected = reference(layout, chunks)
            async with client(proc, t, f"paced-{t.name}") as c:
                await c.put_chunks(keys, chunks, layout)
                order = []
                async with c.fetch_layers(keys, layout, transport="shm" if i % 2 else "http", mode="layerwise",
                                          compute_window=windows) as layers:
                    async for idx, view in layers:
                        assert np.array_equal(np.frombuffer(view, np.uint8), expected[idx])
                        order.append(idx)
                    assert order == list(range(layout.num_layers))
                    return layers.stats.server.allocation

        async def scenario():
            return await asyncio.gather(*(one(i, t, w) for i, (t, w) in enumerate(zip(tenants, [0.002, 0.01, 0.0005]))))

        allocations = run(scenario())
        assert all(a["policy"] == "calibrated-stall-opt" and a["rate_bytes_per_s"] > 0 for a in allocations)
        assert all(a["rate_bytes_per_s"] <= 0.4e9 / 8 * (1 + 1e-9) for a in allocations)  # each within the pool
        # Slowed: each sent more than its bucket's burst (so it was metered), and by the server's accounting
        # no faster than the pool, whatever its share was over time.
        assert all(0 < a["delivered_bytes_per_s"] <= 0.4e9 / 8 * (1 + 1e-9) for a in allocations), allocations
        assert all(a["epoch"] >= 1 for a in allocations)
        status = rpc(str(sock), "status")["bandwidth"]
        assert status["policy"] == "calibrated-stall-opt" and status["leases"] == {} and status["waiting"] == []
    finally:
        proc.stop()


def test_transfers_running_beside_a_held_one_share_the_pool_with_it(tmp_path):
    """Overlap shown by events, not timing: transfer A is held before its second layer (a LayerGate) with
    its lease; B and C are then admitted and run to the end while A still holds it; the three leases
    together stay within the pool, and A, released, finishes with the right bytes. (Each asks for what
    its compute window needs, so calibrated-stall-opt can admit all three at once; a lease keeps the
    rate it was admitted with, so under "equal" a lone transfer would take the whole pool and the
    others would wait for it.)"""
    tenants = make_tenants("a", "b", "c")
    config = write_config(tmp_path / "c.toml", tmp_path / "data", tenants, extra=(
        f'\n[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\n'
        '\n[bandwidth]\ncapacity_gbps = 0.4\npolicy = "calibrated-stall-opt"\nmargin_gbps = 0.01\nepoch_ms = 5\n'))
    gate = LayerGate()
    node = InProcessNode(config, pacers=[gate]).start()
    capacity = 0.4e9 / 8
    try:
        layout = tiny_layout(64)
        data = {}
        for i, t in enumerate(tenants):
            boto_client(node.endpoint, t).create_bucket(Bucket=f"paced-{t.name}")
            data[t.name] = (keys_for(layout, 40, f"g{i}"), make_chunks(layout, 40, seed=40 + i))

        async def put(t):
            async with client(node, t, f"paced-{t.name}") as c:
                await c.put_chunks(*data[t.name], layout)

        async def fetch(t):
            keys, chunks = data[t.name]
            async with client(node, t, f"paced-{t.name}") as c:
                payload, stats = await c.fetch(keys, layout, "http", mode="layerwise", compute_window=0.01)
                assert np.array_equal(payload, reference(layout, chunks))
                return stats.server.allocation

        async def scenario():
            await asyncio.gather(*(put(t) for t in tenants))
            gate.hold_before(1)
            held = asyncio.ensure_future(fetch(tenants[0]))
            assert await asyncio.to_thread(gate.wait_held), "transfer A never reached its gate"
            leases = rpc(node.rpc_socket, "status")["bandwidth"]["leases"]
            assert [v["tenant"] for v in leases.values()] == ["a"], leases
            beside = await asyncio.gather(fetch(tenants[1]), fetch(tenants[2]))
            leases = rpc(node.rpc_socket, "status")["bandwidth"]["leases"]
            assert not held.done() and [v["tenant"] for v in leases.values()] == ["a"], leases  # B and C ran beside A
            assert gate.open()
            return await held, beside

        a_alloc, beside = run(scenario())
        rates = [a_alloc["rate_bytes_per_s"]] + [b["rate_bytes_per_s"] for b in beside]
        assert all(r > 0 for r in rates) and sum(rates) <= capacity * (1 + 1e-9), (a_alloc, beside)
        assert all(0 <= b["delivered_bytes_per_s"] <= b["rate_bytes_per_s"] * (1 + 1e-9) for b in beside), beside
        assert rpc(node.rpc_socket, "status")["bandwidth"]["leases"] == {}
    finally:
        gate.open()
        node.stop()
