"""``objectcache bench s3ops``: plain S3 PUT/GET throughput and latency, ObjectCache beside moto and SeaweedFS.

The three run as separate server processes on 127.0.0.1 and are driven by the
same aiobotocore client code in the same run: 4 KiB and 1 MiB objects,
concurrency 1 and 16. moto's server (Python, in memory) and SeaweedFS (Go,
``weed server``: master, volume, filer and S3 gateway, plus a second volume server) are peer S3
implementations; the ratios show how much of the per-request cost is ObjectCache's.
Each (size, concurrency) is measured ``REPEATS`` times, the servers taking turns,
and the median run counts (the spread is the slowest and fastest run).

Beside throughput it reports CPU milliseconds per operation, both for each
server (all its processes, from ``/proc``) and for the client, which shares
this machine's cores: when the client's CPU per operation approaches the
server's, throughput measures the client as much as the server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import time

import numpy as np

from .harness import add_bench_parser, finish, grouped_bars, print_table, print_targets, progress, s3_client, start_server
from .upstreams import Moto, SeaweedFS, Upstream

SIZES = {"4KiB": 4096, "1MiB": 1 << 20}
CONCURRENCY = (1, 16)
REPEATS = 3
SIDES = ("objectcache", "moto", "seaweedfs")
# One bucket per server for the whole run: SeaweedFS gives every bucket its own volumes, and a
# bucket per case would exhaust a single volume server's slots.
BUCKET = "s3ops-bench"


async def create_bucket(endpoint: str, ak: str, sk: str) -> None:
    async with s3_client(endpoint, ak, sk) as s3:
        await s3.create_bucket(Bucket=BUCKET)


def group_cpu_s(pgids: list[int]) -> float | None:
    """CPU seconds used so far by every live process of these process groups (Linux ``/proc``; None elsewhere)."""
    if not os.path.isdir("/proc/self"):
        return None
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[2]) in pgids:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def client_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(endpoint: str, ak: str, sk: str, size: int, concurrency: int, ops: int, server_pgids: list[int], run_no: int) -> dict:
    async with s3_client(endpoint, ak, sk, concurrency) as s3:
        prefix = f"{size}-{concurrency}-{run_no}"
        body = os.urandom(size)
        result = {}
        for op in ("put", "get"):
            latencies: list[float] = []
            sem = asyncio.Semaphore(concurrency)

            async def one(i: int) -> None:
                async with sem:
                    t = time.perf_counter()
                    if op == "put":
                        await s3.put_object(Bucket=BUCKET, Key=f"{prefix}/k{i}", Body=body)
                    else:
                        r = await s3.get_object(Bucket=BUCKET, Key=f"{prefix}/k{i}")
                        await r["Body"].read()
                    latencies.append(time.perf_counter() - t)

            server0, client0 = group_cpu_s(server_pgids), client_cpu_s()
            start = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(ops)))
            elapsed = time.perf_counter() - start
            server1 = group_cpu_s(server_pgids)
            result[op] = {"ops": ops, "elapsed": elapsed, "latencies": latencies,
                          "server_cpu_s": None if server0 is None or server1 is None else server1 - server0,
                          "client_cpu_s": client_cpu_s() - client0}
        return result


def summarise(runs: list[dict]) -> dict:
    """One side of one row over its runs: median throughput and its spread, latency percentiles and CPU over all runs."""
    rates = [r["ops"] / r["elapsed"] for r in runs]
    ops = sum(r["ops"] for r in runs)
    latencies = [x for r in runs for x in r["latencies"]]
    server = None if any(r["server_cpu_s"] is None for r in runs) else sum(r["server_cpu_s"] for r in runs)
    return {"ops_per_s": statistics.median(rates), "ops_per_s_min": min(rates), "ops_per_s_max": max(rates), "runs": len(runs),
            "p50_ms": float(np.percentile(latencies, 50) * 1000), "p99_ms": float(np.percentile(latencies, 99) * 1000),
            "server_cpu_ms_per_op": None if server is None else server / ops * 1000,
            "client_cpu_ms_per_op": sum(r["client_cpu_s"] for r in runs) / ops * 1000}


async def run_all(quick: bool) -> tuple[list[dict], str]:
    oc = start_server()
    peers: dict[str, Upstream] = {}
    note = ""
    rows = []
    try:
        peers["moto"] = Moto().start()
        try:
            peers["seaweedfs"] = SeaweedFS().start()
        except RuntimeError as e:
            note = str(e).splitlines()[0]
        servers = {"objectcache": (oc.endpoint, oc.access_key, oc.secret_key, [oc.proc.pid]),
                   **{name: (p.endpoint, p.access_key, p.secret_key, p.pgids) for name, p in peers.items()}}
        for endpoint, ak, sk, _ in servers.values():
            await create_bucket(endpoint, ak, sk)
        repeats = 1 if quick else REPEATS
        for size_name, size, conc in progress([(n, s, c) for n, s in SIZES.items() for c in CONCURRENCY], desc="s3ops"):
            ops = (20 if size > 65536 else 50) if quick else (200 if size > 65536 else 500)
            runs: dict[str, list[dict]] = {name: [] for name in servers}
            for run_no in range(repeats):  # the servers take turns, so load from elsewhere falls on all of them
                for name, (endpoint, ak, sk, pgids) in servers.items():
                    runs[name].append(await measure(endpoint, ak, sk, size, conc, ops, pgids, run_no))
            for op in ("put", "get"):
                row = {"size": size_name, "concurrency": conc, "op": op, **{name: summarise([r[op] for r in runs[name]]) for name in servers}}
                row["throughput_ratio"] = row["objectcache"]["ops_per_s"] / row["moto"]["ops_per_s"]
                if "seaweedfs" in row:
                    row["vs_seaweedfs"] = row["objectcache"]["ops_per_s"] / row["seaweedfs"]["ops_per_s"]
                rows.append(row)
    finally:
        oc.stop()
        for p in peers.values():
            p.stop()
    return rows, note


def run(args: argparse.Namespace) -> dict:
    rows, note = asyncio.run(run_all(args.quick))
    sides = [s for s in SIDES if s in rows[0]]
    names = {"objectcache": "ObjectCache", "moto": "moto", "seaweedfs": "SeaweedFS"}

    def ms(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}"

    print_table(
        ["size", "conc", "op", *(f"{names[s]} ops/s (spread)" for s in sides), *(f"{names[s]} p50 / p99 ms" for s in sides),
         "ObjectCache / moto", *(["ObjectCache / SeaweedFS"] if "seaweedfs" in sides else []),
         *(f"server CPU ms/op: {names[s]}" for s in sides), *(f"client CPU ms/op: {names[s]}" for s in sides)],
        [[r["size"], r["concurrency"], r["op"].upper(),
          *(f"{r[s]['ops_per_s']:.0f} ({r[s]['ops_per_s_min']:.0f}–{r[s]['ops_per_s_max']:.0f})" for s in sides),
          *(f"{r[s]['p50_ms']:.2f} / {r[s]['p99_ms']:.2f}" for s in sides),
          f"{r['throughput_ratio']:.2f}×", *([f"{r['vs_seaweedfs']:.2f}×"] if "seaweedfs" in sides else []),
          *(ms(r[s]["server_cpu_ms_per_op"]) for s in sides), *(ms(r[s]["client_cpu_ms_per_op"]) for s in sides)] for r in rows])
    if note:
        print(f"\n{note}")
    met = {"4 KiB PUT and GET at concurrency 16 ≥ 3× moto":
           all(r["throughput_ratio"] >= 3 for r in rows if r["size"] == "4KiB" and r["concurrency"] == 16),
           "ahead of moto at every size, concurrency and op": all(r["throughput_ratio"] > 1 for r in rows)}
    if "seaweedfs" in sides:
        met["ahead of SeaweedFS at every size, concurrency and op"] = all(r["vs_seaweedfs"] > 1 for r in rows)
    print_targets(met)
    result = {"benchmark": "s3ops", "quick": args.quick, "repeats": 1 if args.quick else REPEATS, "rows": rows, "targets": met,
              "note": note}
    return finish(args, result, plot)


def plot(result: dict, fig) -> None:
    rows = result["rows"]
    ax = fig.subplots()
    names = {"objectcache": "ObjectCache", "moto": "moto server", "seaweedfs": "SeaweedFS"}
    grouped_bars(ax, [f"{r['size']} c{r['concurrency']} {r['op'].upper()}" for r in rows],
                 {names[s]: [r[s]["ops_per_s"] for r in rows] for s in SIDES if s in rows[0]})
    ax.set_ylabel("operations / s (median run)")
    ax.set_title("bench s3ops: ObjectCache beside moto and SeaweedFS")
    ax.legend()


def add_parser(sub) -> None:
    add_bench_parser(sub, "s3ops", "plain S3 PUT/GET throughput and latency, beside moto's server and SeaweedFS", run)
