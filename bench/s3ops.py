"""``objectcache bench s3ops``: plain S3 PUT/GET throughput and latency, ObjectCache beside moto.

Both run as separate server processes on 127.0.0.1 and are driven by the same
aiobotocore client code in the same run: 4 KiB and 1 MiB objects, concurrency
1 and 16. moto's server is a peer S3 implementation, not a performance
target; the ratio shows how much of the per-request cost is the gateway's.

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
import socket
import subprocess
import sys
import time

import numpy as np

from .harness import add_bench_parser, finish, grouped_bars, print_table, print_targets, progress, s3_client, start_server

SIZES = {"4KiB": 4096, "1MiB": 1 << 20}
CONCURRENCY = (1, 16)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto() -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc, endpoint
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("moto server did not start")


def group_cpu_s(pgid: int) -> float | None:
    """CPU seconds used so far by every live process of a process group (Linux ``/proc``; None elsewhere)."""
    if not os.path.isdir("/proc/self"):
        return None
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[2]) == pgid:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def client_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(endpoint: str, ak: str, sk: str, size: int, concurrency: int, ops: int, server_pgid: int) -> dict:
    async with s3_client(endpoint, ak, sk, concurrency) as s3:
        bucket = f"s3ops-{size}-{concurrency}"
        await s3.create_bucket(Bucket=bucket)
        body = os.urandom(size)
        result = {}
        for op in ("put", "get"):
            latencies: list[float] = []
            sem = asyncio.Semaphore(concurrency)

            async def one(i: int) -> None:
                async with sem:
                    t = time.perf_counter()
                    if op == "put":
                        await s3.put_object(Bucket=bucket, Key=f"k{i}", Body=body)
                    else:
                        r = await s3.get_object(Bucket=bucket, Key=f"k{i}")
                        await r["Body"].read()
                    latencies.append(time.perf_counter() - t)

            server0, client0 = group_cpu_s(server_pgid), client_cpu_s()
            start = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(ops)))
            elapsed = time.perf_counter() - start
            server1 = group_cpu_s(server_pgid)
            result[op] = {"ops_per_s": ops / elapsed, "mib_per_s": ops * size / elapsed / 2**20,
                          "p50_ms": float(np.percentile(latencies, 50) * 1000), "p99_ms": float(np.percentile(latencies, 99) * 1000),
                          "server_cpu_ms_per_op": None if server0 is None or server1 is None else (server1 - server0) / ops * 1000,
                          "client_cpu_ms_per_op": (client_cpu_s() - client0) / ops * 1000}
        return result


async def run_all(quick: bool) -> list[dict]:
    oc = start_server()
    moto, moto_endpoint = start_moto()
    rows = []
    try:
        for size_name, size, conc in progress([(n, s, c) for n, s in SIZES.items() for c in CONCURRENCY], desc="s3ops"):
            ops = (20 if size > 65536 else 50) if quick else (200 if size > 65536 else 1000)
            a = await measure(oc.endpoint, oc.access_key, oc.secret_key, size, conc, ops, oc.proc.pid)
            b = await measure(moto_endpoint, "testing", "testing", size, conc, ops, moto.pid)
            for op in ("put", "get"):
                rows.append({"size": size_name, "concurrency": conc, "op": op, "objectcache": a[op], "moto": b[op],
                             "throughput_ratio": a[op]["ops_per_s"] / b[op]["ops_per_s"]})
    finally:
        oc.stop()
        moto.terminate()
        moto.wait(10)
    return rows


def run(args: argparse.Namespace) -> dict:
    rows = asyncio.run(run_all(args.quick))
    def ms(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}"

    print_table(
        ["size", "conc", "op", "ObjectCache ops/s", "p50 ms", "p99 ms", "moto ops/s", "p50 ms", "p99 ms", "ObjectCache / moto",
         "server CPU ms/op: ObjectCache", "moto", "client CPU ms/op: ObjectCache", "moto"],
        [[r["size"], r["concurrency"], r["op"].upper(),
          *(v for side in (r["objectcache"], r["moto"]) for v in (f"{side['ops_per_s']:.0f}", f"{side['p50_ms']:.2f}", f"{side['p99_ms']:.2f}")),
          f"{r['throughput_ratio']:.2f}×",
          ms(r["objectcache"]["server_cpu_ms_per_op"]), ms(r["moto"]["server_cpu_ms_per_op"]),
          ms(r["objectcache"]["client_cpu_ms_per_op"]), ms(r["moto"]["client_cpu_ms_per_op"])] for r in rows])
    met = {"4 KiB PUT and GET at concurrency 16 ≥ 3× moto":
           all(r["throughput_ratio"] >= 3 for r in rows if r["size"] == "4KiB" and r["concurrency"] == 16)}
    print_targets(met)
    result = {"benchmark": "s3ops", "quick": args.quick, "rows": rows, "targets": met}
    return finish(args, result, plot)


def plot(result: dict, fig) -> None:
    rows = result["rows"]
    ax = fig.subplots()
    grouped_bars(ax, [f"{r['size']} c{r['concurrency']} {r['op'].upper()}" for r in rows],
                 {"ObjectCache": [r["objectcache"]["ops_per_s"] for r in rows], "moto server": [r["moto"]["ops_per_s"] for r in rows]})
    ax.set_ylabel("operations / s")
    ax.set_title("bench s3ops: ObjectCache beside moto's server")
    ax.legend()


def add_parser(sub) -> None:
    add_bench_parser(sub, "s3ops", "plain S3 PUT/GET throughput and latency, beside moto's server", run)
