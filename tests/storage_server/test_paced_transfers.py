"""Layerwise transfers through a capped bandwidth pool: correct bytes, in layer order, allocation visible."""

from __future__ import annotations

import asyncio

import numpy as np
from kvsupport import client, keys_for, make_chunks, reference, rpc, run, tiny_layout
from support import ServerProcess, boto_client, make_tenants, write_config


def test_three_concurrent_paced_transfers(tmp_path):
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
        assert all(a["epoch"] >= 1 for a in allocations)
        status = rpc(str(sock), "status")["bandwidth"]
        assert status["policy"] == "calibrated-stall-opt" and status["leases"] == {} and status["waiting"] == []
    finally:
        proc.stop()
