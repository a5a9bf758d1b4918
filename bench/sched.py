"""``objectcache bench sched``: bandwidth policies under a shared cap, measured end to end.

Three concurrent-request workloads with Llama 3.1 8B byte sizes and the A100
compute model (DESIGN §6/§7): A = {16K, 64K} × {50%, 87.5%} under 80 Gbps,
B = the same four under 50 Gbps, C = {16K, 32K, 64K} × {50%, 87.5%} under
50 Gbps. For each policy the storage server is restarted with that policy and
cap, the requests are issued together, and each one's serving loop computes
layer ℓ as soon as it lands; the same requests also run without a cap.
Reported per policy: the allocated rates (from each transfer's END report),
measured TTFT per request, the total added TTFT over the uncapped run, its
ratio to equal's, the model's prediction of the same (``L·max(0, s/r − c)``)
and pacing accuracy (delivered / allocated rate).

``--scale k`` divides bytes and caps by k and keeps compute, so every stall is
unchanged. ``--compress m`` (``--quick`` uses it) divides compute by m as well
and the bytes by m more, so every time shrinks m-fold at the same ratios.
Requests of one round must be admitted in the same epoch to be concurrent; a
round whose END reports show two epochs is run again (at most three times)
and the report says how many rounds were retried.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np

from client_sdk import ObjectCacheClient, chunk_keys
from scheduler import POLICIES, TransferDemand, added_stall, allocate

from .compute_model import NUM_LAYERS, ModelledGPU, per_layer_seconds
from .harness import BenchServer, add_bench_parser, finish, grouped_bars, llama_layout, power_of_two, print_table, print_targets, progress, start_server

GBPS = 1e9 / 8
CHUNK_TOKENS = 64
MARGIN_GBPS = 5.0
EPOCH_MS = 50
UNCAPPED = "uncapped"
FOUR = [(16384, 0.5), (16384, 0.875), (65536, 0.5), (65536, 0.875)]
WORKLOADS: dict[str, tuple[list[tuple[int, float]], float]] = {
    "A": (FOUR, 80.0),
    "B": (FOUR, 50.0),
    "C": ([(16384, 0.5), (16384, 0.875), (32768, 0.5), (32768, 0.875), (65536, 0.5), (65536, 0.875)], 50.0),
}
# The benchmark issue's targets: equal's added TTFT over calibrated-stall-opt's.
TARGET_RATIO = {"A": 1.7, "B": 1.7, "C": 1.2}


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


def pool_toml(policy: str, cap_gbps: float, scale: int) -> str:
    if policy == UNCAPPED:  # the same epoch admission, with a cap nothing reaches
        return f"\n[bandwidth]\ncapacity_gbps = 100000\npolicy = \"equal\"\nepoch_ms = {EPOCH_MS}\n"
    return (f"\n[bandwidth]\ncapacity_gbps = {cap_gbps / scale}\npolicy = \"{policy}\"\n"
            f"margin_gbps = {MARGIN_GBPS / scale}\nepoch_ms = {EPOCH_MS}\n")


class Workload:
    """The requests of one workload: keys in the store, compute windows, the model's demands."""

    def __init__(self, name: str, scale: int, compress: int) -> None:
        self.name = name
        self.requests, self.cap_gbps = WORKLOADS[name]
        self.scale, self.compress = scale, compress
        self.layout = llama_layout(CHUNK_TOKENS, scale * compress)
        self.keys: list[list[str]] = []
        self.windows = [per_layer_seconds(ctx, int(ctx * hit)) / compress for ctx, hit in self.requests]

    async def store(self, c: ObjectCacheClient, stored: dict[tuple[int, float], list[str]]) -> None:
        """Write each request's chunks, once across workloads (A and B share all four requests)."""
        for ctx, hit in self.requests:
            if (ctx, hit) not in stored:
                rng = np.random.default_rng([ctx, int(hit * 1000)])
                n = int(ctx * hit) // CHUNK_TOKENS
                keys = chunk_keys(rng.integers(0, 128_000, n * CHUNK_TOKENS), CHUNK_TOKENS, f"sched-{ctx}-{hit}")
                for i in range(0, n, 512):
                    part = keys[i:i + 512]
                    await c.put_chunks(part, list(rng.integers(0, 256, (len(part), self.layout.chunk_bytes), dtype=np.uint8)), self.layout)
                stored[(ctx, hit)] = keys
            self.keys.append(stored[(ctx, hit)])

    def modelled_added_ttft(self, policy: str) -> list[float]:
        """Full-size seconds per request (the same at any scale) by the model."""
        demands = [TransferDemand(int(ctx * hit) * 4096.0, per_layer_seconds(ctx, int(ctx * hit)), NUM_LAYERS) for ctx, hit in self.requests]
        rates = allocate(policy, demands, self.cap_gbps * GBPS, MARGIN_GBPS * GBPS)
        return added_stall(demands, rates)

    async def round(self, c: ObjectCacheClient, compute: bool) -> list[dict]:
        """All requests at once; each computes layer ℓ when it lands (when ``compute``) on its own modelled GPU."""
        async def one(keys: list[str], window: float) -> dict:
            gpu = ModelledGPU()
            t = time.perf_counter()
            try:
                async with c.fetch_layers(keys, self.layout, "shm", mode="layerwise", compute_window=window) as layers:
                    async for _ in layers:
                        if compute:
                            await gpu.compute(window)
                ttft = time.perf_counter() - t
            finally:
                gpu.close()
            alloc = layers.stats.server.allocation
            return {"ttft_s": ttft * self.compress, "epoch": alloc.get("epoch"),
                    "allocated_gbps": alloc.get("rate_bytes_per_s", 0.0) / GBPS * self.scale,
                    "delivered_gbps": alloc.get("delivered_bytes_per_s", 0.0) / GBPS * self.scale}
        return await asyncio.gather(*(one(k, w) for k, w in zip(self.keys, self.windows)))


async def run_policy(srv: BenchServer, w: Workload, policy: str) -> tuple[BenchServer, dict]:
    srv = srv.restart(pool_toml(policy, w.cap_gbps, w.scale))
    async with ObjectCacheClient(srv.endpoint, srv.access_key, srv.secret_key, bucket="bench-sched") as c:
        await w.round(c, compute=False)  # registers regions, warms the page cache and connections
        retries = 0
        while True:
            results = await w.round(c, compute=True)
            if len({r["epoch"] for r in results}) == 1 or retries == 2:
                break
            retries += 1
    return srv, {"requests": results, "retried_rounds": retries,
                 "concurrent": len({r["epoch"] for r in results}) == 1}


async def run_workloads(args: argparse.Namespace) -> list[dict]:
    names, scale, compress = args.workloads, args.scale, args.compress
    srv = start_server()
    out = []
    try:
        async with ObjectCacheClient(srv.endpoint, srv.access_key, srv.secret_key, bucket="bench-sched") as c:
            await c.ensure_bucket()
            workloads = [Workload(n, scale, compress) for n in names]
            stored: dict[tuple[int, float], list[str]] = {}
            for w in workloads:
                await w.store(c, stored)
        steps = [(w, p) for w in workloads for p in (UNCAPPED, *POLICIES)]
        runs: dict[tuple[str, str], dict] = {}
        for w, policy in progress(steps, desc="sched"):
            srv, runs[(w.name, policy)] = await run_policy(srv, w, policy)
        for w in workloads:
            base = [r["ttft_s"] for r in runs[(w.name, UNCAPPED)]["requests"]]
            policies = {}
            for policy in POLICIES:
                run = runs[(w.name, policy)]
                added = [max(r["ttft_s"] - b, 0.0) for r, b in zip(run["requests"], base)]
                policies[policy] = {**run, "added_ttft_s": sum(added), "modelled_added_ttft_s": sum(w.modelled_added_ttft(policy)),
                                    "pacing_accuracy": [r["delivered_gbps"] / r["allocated_gbps"] for r in run["requests"] if r["allocated_gbps"] > 0]}
            for policy, p in policies.items():
                eq = policies["equal"]
                p["equal_over_this"] = eq["added_ttft_s"] / p["added_ttft_s"] if p["added_ttft_s"] > 0 else float("inf")
                p["modelled_equal_over_this"] = (eq["modelled_added_ttft_s"] / p["modelled_added_ttft_s"]
                                                 if p["modelled_added_ttft_s"] > 0 else float("inf"))
            out.append({"workload": w.name, "cap_gbps": w.cap_gbps,
                        "requests": [{"context": ctx, "hit": hit} for ctx, hit in w.requests],
                        "uncapped": runs[(w.name, UNCAPPED)], "policies": policies})
    finally:
        srv.stop()
    return out


def targets(workloads: list[dict]) -> dict[str, bool]:
    met = {}
    for w in workloads:
        p = w["policies"]
        met[f"{w['workload']}: calibrated-stall-opt ≥ {TARGET_RATIO[w['workload']]}× less added TTFT than equal"] = \
            p["calibrated-stall-opt"]["equal_over_this"] >= TARGET_RATIO[w["workload"]]
        met[f"{w['workload']}: stall-opt beats equal"] = p["stall-opt"]["added_ttft_s"] < p["equal"]["added_ttft_s"]
    accuracy = [a for w in workloads for p in w["policies"].values() for a in p["pacing_accuracy"]]
    met["pacing accuracy within ±5%"] = bool(accuracy) and all(abs(a - 1) <= 0.05 for a in accuracy)
    return met


def plot(result: dict, fig) -> None:
    workloads = result["workloads"]
    axes = fig.subplots(1, len(workloads), squeeze=False)[0]
    for ax, w in zip(axes, workloads):
        grouped_bars(ax, list(POLICIES), {"measured": [w["policies"][p]["added_ttft_s"] for p in POLICIES],
                                          "model": [w["policies"][p]["modelled_added_ttft_s"] for p in POLICIES]})
        ax.set_title(f"workload {w['workload']} ({w['cap_gbps']:.0f} Gbps)")
        ax.set_ylabel("total added TTFT (s, full size)")
    axes[0].legend()
    fig.suptitle(f"bench sched: bytes and caps ÷{result['scale']}, times ÷{result['compress']} (reported at full size)")


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        args.workloads, args.scale, args.compress = ["A"], 64, 16
    n = 1000 if args.quick else 10_000
    alloc = time_allocation(n, 3 if args.quick else 20)
    print(f"Allocation of {n} demands (median ms):\n")
    print_table(["policy", "ms"], [[p, f"{ms:.2f}"] for p, ms in alloc.items()])
    workloads = asyncio.run(run_workloads(args))
    scale, compress = args.scale, args.compress
    for w in workloads:
        reqs = ", ".join(f"{r['context'] // 1024}K@{r['hit']:.1%}" for r in w["requests"])
        uncapped = ", ".join(f"{r['ttft_s']:.3f}" for r in w["uncapped"]["requests"])
        print(f"\nWorkload {w['workload']}: {reqs} under {w['cap_gbps']:.0f} Gbps (bytes and cap ÷{scale}, times ÷{compress}; "
              f"figures at full size). Uncapped TTFT (s): {uncapped}\n")
        print_table(["policy", "allocated Gbps", "TTFT s", "added TTFT s", "equal / this", "model: added s", "model: equal / this",
                     "delivered/allocated", "concurrent"],
                    [[p, " / ".join(f"{r['allocated_gbps']:.2f}" for r in v["requests"]), " / ".join(f"{r['ttft_s']:.3f}" for r in v["requests"]),
                      f"{v['added_ttft_s']:.3f}", f"{v['equal_over_this']:.2f}", f"{v['modelled_added_ttft_s']:.3f}",
                      f"{v['modelled_equal_over_this']:.2f}", " / ".join(f"{a:.3f}" for a in v["pacing_accuracy"]),
                      "yes" if v["concurrent"] else f"no ({v['retried_rounds']} retries)"] for p, v in w["policies"].items()])
    met = targets(workloads)
    print_targets(met)
    result = {"benchmark": "sched", "quick": args.quick, "scale": scale, "compress": compress, "allocation_ms": alloc,
              "allocation_demands": n, "workloads": workloads, "targets": met}
    return finish(args, result, plot)


def add_parser(sub) -> None:
    p = add_bench_parser(sub, "sched", "bandwidth policies under a shared cap: added TTFT per policy, pacing accuracy", run)
    p.add_argument("--scale", type=power_of_two, default=32, help="divide bytes and caps by this (power of two); stalls are unchanged")
    p.add_argument("--compress", type=int, default=1, help="divide every time by this too (bytes by it again)")
    p.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
