"""``objectcache bench sched``: allocator cost at scale, and pacing accuracy of concurrent transfers.

Pacing accuracy: three concurrent layerwise loads over ``shm`` share a capped
pool; for each, the server reports the rate it allocated and the rate it
delivered (bytes / time since admission). Ratios near 1 mean the token
buckets and the DRR dispatcher give every request its allocation.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np

from client_sdk import KVLayout, ObjectCacheClient, chunk_keys
from scheduler import POLICIES, TransferDemand, allocate

from .harness import add_bench_parser, emit, print_table, start_server

GBPS = 1e9 / 8


def time_allocation(n: int, repeats: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    demands = [TransferDemand(float(s), float(c), 32) for s, c in zip(rng.uniform(1e6, 1e9, n), rng.uniform(1e-3, 0.3, n))]
    out = {}
    for policy in POLICIES:
        samples = []
        for _ in range(repeats):
            t = time.perf_counter()
            allocate(policy, demands, 50 * GBPS, margin=5 * GBPS)
            samples.append(time.perf_counter() - t)
        out[policy] = statistics.median(samples) * 1000
    return out


async def pacing_accuracy(quick: bool) -> list[dict]:
    capacity_gbps = 0.8 if quick else 2.0
    srv = start_server(f"\n[bandwidth]\ncapacity_gbps = {capacity_gbps}\npolicy = \"stall-opt\"\nepoch_ms = 5\n")
    try:
        layout = KVLayout.preset("llama-3.1-8b", chunk_tokens=16).with_chunk_tokens(16)
        layout = KVLayout(layout.num_layers, 16, 2, 128, "bfloat16")  # 8 KiB per chunk per layer
        sizes = [40, 80, 160] if quick else [100, 200, 400]
        windows = [0.002, 0.004, 0.001]
        rng = np.random.default_rng(0)
        async with ObjectCacheClient(srv.endpoint, srv.access_key, srv.secret_key, bucket="bench-sched") as c:
            await c.ensure_bucket()
            key_sets = []
            for i, n in enumerate(sizes):
                keys = chunk_keys(rng.integers(0, 50000, n * 16), 16, f"sched{i}")
                await c.put_chunks(keys, list(rng.integers(0, 256, (n, layout.chunk_bytes), dtype=np.uint8)), layout)
                key_sets.append(keys)

            async def one(keys, window):
                async with c.fetch_layers(keys, layout, "shm", mode="layerwise", compute_window=window) as layers:
                    async for _ in layers:
                        pass
                    return layers.stats.server.allocation

            allocations = await asyncio.gather(*(one(k, w) for k, w in zip(key_sets, windows)))
        rows = []
        for n, w, a in zip(sizes, windows, allocations):
            rows.append({"chunks": n, "compute_window_s": w, "allocated_gbps": a["rate_bytes_per_s"] / GBPS,
                         "delivered_gbps": a["delivered_bytes_per_s"] / GBPS,
                         "accuracy": a["delivered_bytes_per_s"] / a["rate_bytes_per_s"]})
        return rows
    finally:
        srv.stop()


def run(args: argparse.Namespace) -> dict:
    n = 1000 if args.quick else 10_000
    alloc = time_allocation(n, 3 if args.quick else 20)
    print(f"Allocation of {n} demands (median ms):\n")
    print_table(["policy", "ms"], [[p, f"{ms:.2f}"] for p, ms in alloc.items()])
    rows = asyncio.run(pacing_accuracy(args.quick))
    print("\nPacing accuracy (3 concurrent layerwise loads over shm, stall-opt):\n")
    print_table(["chunks", "compute/layer (s)", "allocated Gbps", "delivered Gbps", "delivered/allocated"],
                [[r["chunks"], r["compute_window_s"], f"{r['allocated_gbps']:.3f}", f"{r['delivered_gbps']:.3f}", f"{r['accuracy']:.3f}"] for r in rows])
    result = {"benchmark": "sched", "quick": args.quick, "allocation_ms": alloc, "allocation_demands": n, "pacing": rows}
    emit(result, args.json)
    return result


def add_parser(sub) -> None:
    add_bench_parser(sub, "sched", "allocator cost and pacing accuracy", run)
