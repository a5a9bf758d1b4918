"""``objectcache bench memory-budget``: the cold kv-get inside a memory cgroup, swept from well below to above its payload.

Dual-Blade (§V) fixes the KV workload and sweeps the host-memory limit: the page cache
thrashes below the working set, a direct path ignores memory above it, and the planner
that gives the first layers the page cache while the budget allows is best across
the sweep. Here the storage server (``objectcache serve`` and its children) runs in a
memory cgroup (v1 or v2; root creates it) whose limit is what the server itself holds
plus a page-cache budget of ``--budget-fraction`` × the payload, and one cold layerwise
shm kv-get per ``storage_server.read_path`` (``page-cache``, ``direct``, ``planner``) and
budget measures TTFT (the layer arrivals measured, the engine's prefill of the uncached
suffix modelled and laid over them layer by layer: Llama 3.1 8B on an A100 at ``--hit``,
scaled with the payload, as ``bench trace`` does), the time to the first layer, the whole
payload, and how busy the store's disk was. Each run restarts the server (a
server keeps the chunk files it read mapped) and drops the page cache; the repeats are
interleaved (every read path once per round) and the medians reported with the load. Needs root and a
memory cgroup controller; elsewhere it says why and stops.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

import numpy as np

from client_sdk import ObjectCacheClient, chunk_keys
from storage_server.residency import page_cached

from .compute_model import modelled_ttft, per_layer_seconds
from .harness import add_bench_parser, finish, llama_layout, print_table, start_server
from .transfer import DiskBusy, drop_page_cache

POLICIES = ("page-cache", "direct", "planner")
FRACTIONS = (0.25, 0.5, 1.0, 2.0)
# Dual-Blade's own figures (OPT-6.7B, 2-11 GB host-memory limits): prefill latency cut by up to 33.1 % (SSD A) and
# 25.4 % (SSD B) against the page-cache baseline, SSD utilisation up to 2.2x.
DUAL_BLADE = {"prefill_latency_cut_max": {"ssd_a": 0.331, "ssd_b": 0.254}, "ssd_utilisation_gain_max": 2.2}


class MemoryCgroup:
    """A memory cgroup this benchmark creates (v2 if the unified hierarchy has the memory controller, else v1)."""

    def __init__(self, name: str) -> None:
        v2 = Path("/sys/fs/cgroup")
        if (v2 / "cgroup.controllers").exists() and "memory" in (v2 / "cgroup.controllers").read_text().split():
            self.path, self.v2 = v2 / name, True
        elif Path("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists():
            self.path, self.v2 = Path("/sys/fs/cgroup/memory") / name, False
        else:
            raise SystemExit("bench memory-budget: no memory cgroup controller on this machine (v1 or v2); nothing measured")
        try:
            self.path.mkdir(exist_ok=True)
        except OSError as e:
            raise SystemExit(f"bench memory-budget: cannot create a memory cgroup ({self.path}: {e.strerror}); run as root") from None
        if not self.v2:
            try:
                (self.path / "memory.move_charge_at_immigrate").write_text("3\n")  # a moved process's pages come along
            except OSError:
                pass  # newer kernels refuse it: the server's pages stay charged where they were (its limit is set after)

    def add(self, pid: int) -> None:
        """``pid`` and every process below it."""
        for p in [pid, *_descendants(pid)]:
            try:
                (self.path / "cgroup.procs").write_text(f"{p}\n")
            except OSError:
                pass  # it exited meanwhile

    def unreclaimable(self) -> int:
        """anon + shmem charged to it: what the server holds itself."""
        names = ("anon", "shmem") if self.v2 else ("total_rss", "total_shmem")
        stat = dict(line.split() for line in (self.path / "memory.stat").read_text().splitlines() if line.count(" ") == 1)
        return sum(int(stat.get(n, 0)) for n in names)

    def limit(self, nbytes: int | None) -> None:
        name = "memory.max" if self.v2 else "memory.limit_in_bytes"
        (self.path / name).write_text(("max" if self.v2 else "-1") + "\n" if nbytes is None else f"{nbytes}\n")

    def remove(self) -> None:
        parent = self.path.parent / "cgroup.procs"
        for pid in (self.path / "cgroup.procs").read_text().split():
            try:
                parent.write_text(f"{pid}\n")
            except OSError:
                pass
        try:
            self.path.rmdir()
        except OSError:
            pass


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                kids = [int(k) for k in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def evict_files(root: Path, min_bytes: int, attempts: int = 50) -> None:
    """Drop the store's chunk files (those of at least ``min_bytes`` under ``root``) from the page cache
    (``fadvise(DONTNEED)``, asked again until the kernel has, bounded): only the chunk data goes cold. Dropping the
    whole page cache (``--drop-all``) also drops the server's and the client's code pages and the store's metadata,
    and the first layer then waits for those to fault back in: the same for every read path, tens of milliseconds
    that vary with the rest of the machine (and it empties the page cache of everything else running there). The
    chunk the warm-up fetch read stays mapped by the server and keeps its pages either way."""
    fds = [os.open(p, os.O_RDONLY) for p in root.rglob("*") if p.is_file() and p.stat().st_size >= min_bytes]
    try:
        for _ in range(attempts):
            for fd in fds:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            if sum(page_cached(fd, 0) for fd in fds) <= 1:
                return
            time.sleep(0.02)
    finally:
        for fd in fds:
            os.close(fd)


async def cold_fetch(server, keys: list[str], layout, payload: int, evict_data: bool = True, compute_per_layer: float = 0.0) -> dict:
    """One cold layerwise shm kv-get: its modelled TTFT (measured layer arrivals, ``compute_per_layer`` seconds of
    prefill per layer laid over them), seconds to the first layer and to the whole payload, disk busy, what the server
    read how, and how long the server's read of layer 0 took (its own timeline: the part of the first layer the read
    path decides)."""
    async with ObjectCacheClient(server.endpoint, server.access_key, server.secret_key, bucket="budget") as c:
        await c.warm_up(payload)  # the client faults its region in: its pages are the client's, not the server's cgroup's
        async with c.fetch_layers(keys[:1], layout, "shm", mode="layerwise") as layers:
            async for _ in layers:
                pass
        if evict_data:
            evict_files(server.root / "data", layout.chunk_bytes)
        else:
            drop_page_cache()
        busy = DiskBusy(server.root)
        t = time.perf_counter()
        arrivals: list[float] = []
        async with c.fetch_layers(keys, layout, "shm", mode="layerwise") as layers:
            async for _ in layers:
                arrivals.append(time.perf_counter() - t)
        total = time.perf_counter() - t
        s = layers.stats.server
        timeline = s.layer_timeline
        return {"ttft_s": modelled_ttft(arrivals, compute_per_layer), "first_layer_s": arrivals[0], "layer0_read_s": timeline[0][1] - timeline[0][0] if timeline else None,
                "layer0_start_s": timeline[0][0] if timeline else None, "server_first_layer_s": s.first_layer_s, "total_s": total, "disk_busy": busy.fraction(), "gb_per_s": payload / total / 1e9,
                "direct_read_bytes": s.direct_read_bytes, "read_ahead_bytes": s.read_ahead_bytes, "resident_sample": s.resident_sample}


def run(args: argparse.Namespace) -> dict:
    if os.geteuid() != 0:
        raise SystemExit("bench memory-budget: needs root (a memory cgroup, and dropping the page cache); nothing measured")
    layout = llama_layout(args.chunk_tokens, args.scale)
    n = 4 if args.quick else args.chunks
    payload = layout.payload_bytes(n)
    fractions = (0.5, 2.0) if args.quick else tuple(args.budget_fraction)
    rng = np.random.default_rng(7)
    keys = chunk_keys(rng.integers(0, 128_000, n * args.chunk_tokens), args.chunk_tokens, "memory-budget")
    cached = n * args.chunk_tokens  # the prefix the kv-get loads; the request's context is cached / hit
    compute_per_layer = per_layer_seconds(round(cached / args.hit), cached) / args.scale
    chunks = rng.integers(0, 256, (n, layout.chunk_bytes), dtype=np.uint8)
    cgroup = MemoryCgroup(f"objectcache-bench-{os.getpid()}")
    server = start_server()
    rows: list[dict] = []
    try:
        async def put() -> None:
            async with ObjectCacheClient(server.endpoint, server.access_key, server.secret_key, bucket="budget") as c:
                await c.ensure_bucket()
                await c.put_chunks(keys, list(chunks), layout)

        asyncio.run(put())
        print(f"payload {payload / 2**20:.0f} MiB ({n} chunks of {layout.chunk_bytes / 2**20:.1f} MiB, {layout.num_layers} layers); "
              f"page-cache budgets {', '.join(f'{f:g}' for f in fractions)} × payload")
        for fraction in fractions:
            runs: dict[str, list[dict]] = {p: [] for p in args.read_paths}
            for _ in range(args.repeats):  # interleaved: every read path once per round, so drift in the load hits them alike
                for label in args.read_paths:
                    cgroup.limit(None)
                    server = server.restart(_server_toml(label))
                    cgroup.add(server.proc.pid)
                    asyncio.run(_settle())
                    held = cgroup.unreclaimable()
                    cgroup.limit(held + int(fraction * payload))
                    runs[label].append(asyncio.run(cold_fetch(server, keys, layout, payload, not args.drop_all, compute_per_layer)) | {"load_1m": os.getloadavg()[0]})
            for label in args.read_paths:
                got = runs[label]
                rows.append({"budget_fraction": fraction, "read_path": label, "payload_bytes": payload, "runs": len(got),
                             "ttft_runs_s": [r["ttft_s"] for r in got], "first_layer_runs_s": [r["first_layer_s"] for r in got],
                             "total_runs_s": [r["total_s"] for r in got],
                             **{k: statistics.median(r[k] for r in got) if got[0][k] is not None else None for k in got[0]}})
    finally:
        server.stop()
        cgroup.remove()
    table = []
    for row in rows:
        # the best of the three read paths as configured by default (a NAME@WINDOW variant is shown beside them, not a rival)
        same = [r for r in rows if r["budget_fraction"] == row["budget_fraction"]]
        rivals = [r for r in same if "@" not in r["read_path"]] or same
        for measure in ("ttft", "first_layer"):
            row[f"{measure}_vs_best"] = row[f"{measure}_s"] / min(r[f"{measure}_s"] for r in rivals)
        table.append([f"{row['budget_fraction']:g}", row["read_path"], f"{row['ttft_s'] * 1e3:.1f}", f"{row['ttft_vs_best']:.2f}",
                      f"{row['first_layer_s'] * 1e3:.1f}",
                      "-" if row["layer0_read_s"] is None else f"{row['layer0_start_s'] * 1e3:.1f} + {row['layer0_read_s'] * 1e3:.1f}",
                      f"{row['server_first_layer_s'] * 1e3:.1f}", f"{row['total_s'] * 1e3:.0f}",
                      f"{row['gb_per_s']:.2f}", "-" if row["disk_busy"] is None else f"{row['disk_busy']:.0%}",
                      f"{row['direct_read_bytes'] / 2**20:.0f}", f"{row['first_layer_vs_best']:.2f}"])
    print(f"modelled prefill compute {compute_per_layer * 1e3:.2f} ms per layer ({args.hit:.1%} of the context cached)")
    print_table(["budget × payload", "read path", "TTFT ms", "TTFT / best", "first layer ms", "server: layer 0 read starts + takes ms", "server first layer ms", "whole ms", "GB/s", "disk busy", "MiB direct", "first layer / best"], table)
    planner = [r for r in rows if r["read_path"] == "planner"]
    print(f"load (1-minute average, median of the runs): {statistics.median(r['load_1m'] for r in rows):.1f} on {os.cpu_count()} cores")
    targets = {"planner best or within 5% of the best TTFT at every budget": all(r["ttft_vs_best"] <= 1.05 for r in planner),
               "planner best or within 5% of the best first layer at every budget": all(r["first_layer_vs_best"] <= 1.05 for r in planner)}
    for name, ok in targets.items():
        print(f"- {name}: {'met' if ok else 'MISSED'}")
    result = {"bench": "memory-budget", "payload_bytes": payload, "hit": args.hit, "compute_per_layer_s": compute_per_layer, "rows": rows, "dual_blade": DUAL_BLADE, "targets": targets,
              "cgroup": "v2" if cgroup.v2 else "v1"}
    return finish(args, result)


def _server_toml(label: str) -> str:
    """``NAME`` or ``NAME@WINDOW``: storage_server.read_path NAME, and read_ahead_window_bytes WINDOW where given
    (``planner@0``: every page-cache layer asked ahead at once, as before the window)."""
    name, _, window = label.partition("@")
    return f'[storage_server]\nread_path = "{name}"\n' + (f"read_ahead_window_bytes = {int(window)}\n" if window else "")


def _read_paths(text: str) -> list[str]:
    labels = [p for p in text.split(",") if p]
    for label in labels:
        name, _, window = label.partition("@")
        if name not in POLICIES or (window and not window.isdigit()):
            raise argparse.ArgumentTypeError(f"{label!r}: NAME[@WINDOW_BYTES], NAME one of {', '.join(POLICIES)}")
    return labels


def _share(text: str) -> float:
    """``--hit``: a share of the context, above 0 and at most 1."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"--hit must be a share of the context in (0, 1], not {text!r}")
    return value


async def _settle() -> None:
    await asyncio.sleep(0.2)  # the restarted server's children are up (start_server returned at its banner)


def add_parser(sub) -> None:
    p = add_bench_parser(sub, "memory-budget", "cold kv-get inside a memory cgroup: page-cache vs direct vs Dual-Blade's planner", run)
    p.add_argument("--chunks", type=int, default=16, help="chunks in the prefix (default 16)")
    p.add_argument("--chunk-tokens", type=int, default=256, help="tokens per chunk (default 256)")
    p.add_argument("--scale", type=int, default=4, help="Llama-3-8B bytes per token divided by this (default 4: 8 MiB chunks)")
    p.add_argument("--budget-fraction", type=float, nargs="+", default=list(FRACTIONS),
                   help="page-cache budgets as fractions of the payload (default 0.25 0.5 1 2)")
    p.add_argument("--read-paths", type=_read_paths, default=list(POLICIES),
                   help="comma-separated NAME[@WINDOW_BYTES] (default page-cache,direct,planner); e.g. planner@0 beside planner: "
                        "the read-ahead all at once against the window, in one interleaved run")
    p.add_argument("--hit", type=_share, default=0.875,
                   help="the share of the request's context the loaded prefix is (default 0.875): sets the modelled prefill compute")
    p.add_argument("--drop-all", action="store_true",
                   help="drop the whole page cache before each run (as before), not only the store's chunk files")
    p.add_argument("--repeats", type=int, default=1, help="cold runs per budget and read path (the median is reported; a run varies by ±20%% with the disk here)")
