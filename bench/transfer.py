"""``objectcache bench transfer``: how fast a cached prefix reaches the destination, path by path.

Llama 3.1 8B layout (S = 4096·G bytes per chunk per layer, divided by
``--scale``), for each G and (context, hit) in one run:

* **opt-local** — memcpy of pre-assembled layer-major bytes into the destination (the physical limit here);
* **S3-CW** — one aiobotocore GET per chunk object through the gateway (concurrency 16), then scatter into layer-major;
* **S3-range** — one ranged GET per chunk per layer (timed on a sample of layers and scaled to all L, said so in the report);
* **loopback-TCP** — the payload's bytes sent over one loopback TCP connection into the destination
  (a sender thread, ``recv_into`` here): what one socket moves on this host, the ceiling of ``http``;
* **ObjectCache-http / -shm / -rdma** — one descriptor, layer-major payload delivered by the storage server
  (http: from its data endpoint; **ObjectCache-http-relay**: the same frames relayed by the gateway;
  rdma: NIXL one-sided writes, where nixl is installed; the report names the UCX transport the storage
  server's remote writes used, from UCX's own protocol-selection report, ``UCX_PROTO_INFO``).

Every path runs once to warm the page cache, then the median of ``--repeats``
(default 3) timed runs counts, reported with the spread (slowest and fastest run);
``--cold`` drops the page cache before each timed run and also measures the disk's
own limit: aligned ``O_DIRECT`` reads of a payload-sized file on the store's
filesystem at queue depths 1–32 (**disk-direct**). Ratios are to opt-local and to
S3-CW measured in the same run. Each case also times the encode and decode of its
descriptor per 1,000 keys.
"""

from __future__ import annotations

import argparse
import asyncio
import mmap
import os
import shutil
import socket
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from client_sdk import KVLayout, ObjectCacheClient, chunk_keys
from client_sdk.rdma import rdma_available
from protocol.config import StorageServerConfig

from .harness import BenchServer, add_bench_parser, finish, grouped_bars, llama_layout, power_of_two, print_table, print_targets, progress, s3_client, start_server
from .wire import shm_descriptor, time_codec

CONTEXTS = [(4096, 0.5), (4096, 0.875), (16384, 0.5), (16384, 0.875), (65536, 0.5), (65536, 0.875)]
G_VALUES = [16, 64, 256]
RANGE_SAMPLE_LAYERS = 2
CODEC_REPEATS = 20
LOOPBACK_PIECE = 1 << 20
# The data endpoint serves http kv-gets; a second client with direct=False measures the gateway's relay.
SERVER_TOML = '[storage_server]\ndata_listen = "127.0.0.1:0"\n'


async def s3_cw(s3, bucket: str, keys: list[str], layout: KVLayout, dest: np.ndarray) -> int:
    sem = asyncio.Semaphore(16)
    n, s = len(keys), layout.per_layer_chunk_bytes
    view = dest.reshape(layout.num_layers, n, s)

    async def one(j: int, key: str) -> None:
        async with sem:
            r = await s3.get_object(Bucket=bucket, Key=key)
            data = await r["Body"].read()
        view[:, j, :] = np.frombuffer(data, np.uint8).reshape(layout.num_layers, s)

    await asyncio.gather(*(one(j, k) for j, k in enumerate(keys)))
    return n


async def s3_range(s3, bucket: str, keys: list[str], layout: KVLayout, dest: np.ndarray, layers: int) -> int:
    sem = asyncio.Semaphore(16)
    n, s = len(keys), layout.per_layer_chunk_bytes
    view = dest.reshape(layout.num_layers, n, s)

    async def one(layer: int, j: int, key: str) -> None:
        async with sem:
            r = await s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={layer * s}-{(layer + 1) * s - 1}")
            data = await r["Body"].read()
        view[layer, j, :] = np.frombuffer(data, np.uint8)

    await asyncio.gather(*(one(layer, j, k) for layer in range(layers) for j, k in enumerate(keys)))
    return layers * n


def loopback_tcp(dest: np.ndarray) -> None:
    """Fill ``dest`` from one loopback TCP connection (a sender thread writes 1 MiB pieces; this thread ``recv_into``)."""
    n = dest.nbytes
    with socket.create_server(("127.0.0.1", 0)) as srv:
        def send() -> None:
            piece = memoryview(bytearray(LOOPBACK_PIECE))
            with socket.create_connection(srv.getsockname()) as c:
                left = n
                while left:
                    left -= c.send(piece[: min(left, LOOPBACK_PIECE)])

        t = threading.Thread(target=send)
        t.start()
        conn, _ = srv.accept()
        with conn:
            view, got = memoryview(dest).cast("B"), 0
            while got < n:
                k = conn.recv_into(view[got:])
                if not k:
                    raise RuntimeError("loopback sender stopped early")
                got += k
        t.join()


DROP_CACHES = "/proc/sys/vm/drop_caches"


def drop_page_cache() -> None:
    """Write back and drop the page cache (needs root); raises with the reason when it cannot."""
    os.sync()
    try:
        with open(DROP_CACHES, "w") as f:
            f.write("3\n")
    except OSError as e:
        raise SystemExit(f"--cold needs to drop the page cache ({DROP_CACHES}: {e.strerror}); run as root or leave --cold out") from None


async def timed(fn, repeats: int = 3, cold: bool = False) -> list[float]:
    """Seconds of each of ``repeats`` runs after one warm-up (page cache, connections, registered regions).

    ``cold``: the page cache is dropped before every run (the warm-up still sets up connections and regions).
    """
    await fn()
    times = []
    for _ in range(repeats):
        if cold:
            drop_page_cache()
        t = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - t)
    return times


DIRECT_BLOCK = 1 << 20  # bytes per O_DIRECT read
DIRECT_DEPTHS = (1, 4, 16, 32)
COLD_READ_DEPTH = StorageServerConfig().cold_read_depth  # the storage server's own queue depth for cold chunks


class DiskBusy:
    """How busy the block device holding ``path`` was since this was made: ``/proc/diskstats`` io_ticks over wall time."""

    def __init__(self, path: Path) -> None:
        dev = os.stat(path).st_dev
        self._name = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve().name
        self._start = (time.perf_counter(), self._ticks())

    def _ticks(self) -> int | None:
        try:
            with open("/proc/diskstats") as f:
                for line in f:
                    fields = line.split()
                    if fields[2] == self._name:
                        return int(fields[12])  # milliseconds the device had I/O in flight
        except (OSError, ValueError, IndexError):
            pass
        return None

    def fraction(self) -> float | None:
        t0, ticks0 = self._start
        ticks = self._ticks()
        if ticks is None or ticks0 is None:
            return None
        return min(1.0, (ticks - ticks0) / 1000 / max(time.perf_counter() - t0, 1e-9))


def write_probe(directory: Path, nbytes: int) -> Path:
    """A file of ``nbytes`` (whole MiB) on the store's filesystem, durable, for O_DIRECT reads."""
    path = directory / "disk-direct.bin"
    block = np.random.default_rng(0).integers(0, 256, DIRECT_BLOCK, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        for _ in range(max(1, nbytes // DIRECT_BLOCK)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    return path


def read_direct(path: Path, depth: int) -> float:
    """GB/s reading ``path`` with aligned O_DIRECT requests of 1 MiB, ``depth`` in flight (never from the page cache)."""
    blocks = os.path.getsize(path) // DIRECT_BLOCK
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        def read(first: int) -> None:
            buf = mmap.mmap(-1, DIRECT_BLOCK)  # page-aligned, as O_DIRECT needs
            for b in range(first, blocks, depth):
                os.preadv(fd, [buf], b * DIRECT_BLOCK)
            buf.close()

        t = time.perf_counter()
        with ThreadPoolExecutor(depth) as pool:
            list(pool.map(read, range(depth)))
        return blocks * DIRECT_BLOCK / (time.perf_counter() - t) / 1e9
    finally:
        os.close(fd)


def disk_direct_limit(probe: Path) -> dict:
    """The disk's own read limit: ``probe`` (a payload-sized file on the store's filesystem, see
    :func:`write_probe`) read with aligned ``O_DIRECT`` requests of 1 MiB by 1–32 threads (the queue depth). GB/s by depth."""
    by_depth = {depth: read_direct(probe, depth) for depth in DIRECT_DEPTHS}
    return {"gb_per_s_by_queue_depth": by_depth, "best_gb_per_s": max(by_depth.values()), "bytes": os.path.getsize(probe)}


async def run_case(c: ObjectCacheClient, relay: ObjectCacheClient, s3, server: list[BenchServer], g: int, context: int, hit: float, scale: int,
                   cold: bool = False, repeats: int = 3) -> dict:
    """One G × context × hit case on every path; ``server`` holds the running server (``--cold`` restarts it)."""
    layout = llama_layout(g, scale)
    n = int(context * hit) // g
    rng = np.random.default_rng(g * 1000 + context)
    keys = chunk_keys(rng.integers(0, 128_000, n * g), g, f"transfer-{context}-{hit}")
    chunks = rng.integers(0, 256, (n, layout.chunk_bytes), dtype=np.uint8)
    await c.put_chunks(keys, list(chunks), layout)
    w = layout.payload_bytes(n)
    src = np.ascontiguousarray(chunks.reshape(n, layout.num_layers, -1).transpose(1, 0, 2)).reshape(-1)
    dest = np.empty(w, np.uint8)

    async def opt_local():
        np.copyto(dest, src)

    async def via(transport, client=c):
        async def go():
            async with client.fetch_layers(keys, layout, transport, mode="layerwise") as layers:
                async for _ in layers:
                    if transport == "http" and layers.stats.direct != client.direct:
                        raise RuntimeError("the http fetch did not take the path it was meant to measure")
        return go

    cold_reports: list[dict] = []

    async def cold_shm() -> list[float]:
        """A storage server keeps the chunk files it has read mapped, and dropping the page cache leaves
        mapped pages resident; so each cold run starts a new server process on the same store (and port)
        first, and a new client whose connection and region a one-chunk fetch sets up, then drops the
        page cache. Right before each run the disk's own O_DIRECT rate at the server's queue depth is
        measured (a virtual disk's rate drifts between minutes), and each run reports how busy the
        store's disk was and what the server decided."""
        times = []
        for _ in range(repeats):
            srv = server[0] = server[0].restart(SERVER_TOML, same_port=True)
            async with ObjectCacheClient(srv.endpoint, srv.access_key, srv.secret_key, bucket=c.bucket) as fresh:
                async def fetch(subset: list[str]):
                    async with fresh.fetch_layers(subset, layout, "shm", mode="layerwise") as layers:
                        async for _ in layers:
                            pass
                    return layers.stats
                await fetch(keys[:1])
                drop_page_cache()
                beside = read_direct(probe, COLD_READ_DEPTH)
                busy = DiskBusy(srv.root)
                t = time.perf_counter()
                stats = await fetch(keys)
                times.append(time.perf_counter() - t)
                cold_reports.append({"disk_busy": busy.fraction(), "resident_sample": stats.server.resident_sample,
                                     "direct_read_bytes": stats.server.direct_read_bytes, "read_ahead_bytes": stats.server.read_ahead_bytes,
                                     "disk_direct_just_before_gb_per_s": beside, "gb_per_s": w / times[-1] / 1e9})
        return times

    async def loopback():
        await asyncio.to_thread(loopback_tcp, dest)

    sample = min(RANGE_SAMPLE_LAYERS, layout.num_layers)
    # --cold: one payload-sized file read O_DIRECT beside each cold shm run and, after the runs, at every depth.
    probe = write_probe(server[0].root, w) if cold else None
    try:
        # The local and shm paths, the ones the targets compare, run side by side first.
        runs = {
            "opt-local": await timed(opt_local, repeats),
            "ObjectCache-shm": await cold_shm() if cold else await timed(await via("shm"), repeats),
            "S3-CW": await timed(lambda: s3_cw(s3, c.bucket, keys, layout, dest), repeats, cold),
            "S3-range": [t * layout.num_layers / sample for t in await timed(lambda: s3_range(s3, c.bucket, keys, layout, dest, sample), 1, cold)],
            "loopback-TCP": await timed(loopback, repeats),
            "ObjectCache-http": await timed(await via("http"), repeats, cold),
            "ObjectCache-http-relay": await timed(await via("http", relay), repeats, cold),
        }
        if rdma_available()[0]:
            runs["ObjectCache-rdma"] = await timed(await via("rdma"), repeats, cold)
        disk = disk_direct_limit(probe) if probe is not None else None
    finally:
        if probe is not None:
            probe.unlink(missing_ok=True)
    requests = {"opt-local": 0, "loopback-TCP": 0, "S3-CW": n, "S3-range": n * layout.num_layers, "ObjectCache-http": 1,
                "ObjectCache-http-relay": 1, "ObjectCache-shm": 1, "ObjectCache-rdma": 1}
    times = {p: statistics.median(r) for p, r in runs.items()}
    descriptor = time_codec(shm_descriptor(keys, layout.num_layers, g, layout.per_layer_chunk_bytes), CODEC_REPEATS)
    row = {
        "chunk_tokens": g, "context": context, "hit": hit, "chunks": n, "payload_bytes": w, "descriptor": descriptor,
        "paths": {p: {"seconds": t, "gb_per_s": w / t / 1e9, "runs_gb_per_s": [w / x / 1e9 for x in runs[p]], "requests": requests[p],
                      "vs_opt_local": times["opt-local"] / t, "vs_s3_cw": times["S3-CW"] / t, "vs_loopback_tcp": times["loopback-TCP"] / t}
                  for p, t in times.items()},
    }
    if disk is not None:
        row["disk_direct"] = disk
        shm = row["paths"]["ObjectCache-shm"]
        shm["vs_disk_direct"] = shm["gb_per_s"] / row["disk_direct"]["best_gb_per_s"]
        same = row["disk_direct"]["gb_per_s_by_queue_depth"].get(COLD_READ_DEPTH)
        shm["vs_disk_direct_same_depth"] = shm["gb_per_s"] / same if same else None
        shm["cold_runs"] = cold_reports
        shm["vs_disk_direct_just_before"] = statistics.median(r["gb_per_s"] / r["disk_direct_just_before_gb_per_s"] for r in cold_reports)
    return row


def ucx_write_transports(log: str) -> list[str]:
    """The UCX transports (``cma/memory``, ``tcp/lo``, ``rc_mlx5/mlx5_0:1``…) a ``UCX_PROTO_INFO=y`` log chose for remote writes."""
    found: list[str] = []
    inside = False
    for line in log.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 1:  # a table's title: which operation it is about
            inside = "remote memory write" in cells[0]
        # "self/…" is the agent's endpoint to itself: a client in another process is never reached that way.
        elif inside and len(cells) == 3 and cells[0] != "Range" and cells[2] and not cells[2].startswith("self/") and cells[2] not in found:
            found.append(cells[2])
    return found


def rdma_note(ucx_log_dir: Path | None = None) -> str:
    """Which engine and UCX transports ObjectCache-rdma ran over (or why it did not run)."""
    available, why = rdma_available()
    if not available:
        return f"ObjectCache-rdma not run: {why}."
    used = []
    for log in sorted(ucx_log_dir.glob("ucx.*.log")) if ucx_log_dir is not None else []:
        used += [t for t in ucx_write_transports(log.read_text(errors="replace")) if t not in used]
    how = ", ".join(used) if used else "not reported (UCX_PROTO_INFO printed no remote-write protocol)"
    return f"ObjectCache-rdma: NIXL over UCX; the storage server's remote writes used {how} (devices {os.environ.get('UCX_NET_DEVICES', 'all')})."


async def run_all(args: argparse.Namespace) -> list[dict]:
    # The storage server reports the UCX protocols it selects (UCX_PROTO_INFO) into args.ucx_logs, for rdma_note.
    args.ucx_logs = Path(tempfile.mkdtemp(prefix="objectcache-bench-ucx-"))
    server = [start_server(SERVER_TOML, env={"UCX_PROTO_INFO": "y", "UCX_LOG_FILE": str(args.ucx_logs / "ucx.%p.log")})]  # --cold restarts it (same endpoint)
    srv = server[0]
    rows = []
    cases = [(64, 4096, 0.5)] if args.quick else [(g, ctx, hit) for g in G_VALUES for ctx, hit in CONTEXTS]
    if args.only:
        g, ctx, hit = args.only.split(":")
        cases = [(int(g), int(ctx), float(hit))]
    try:
        async with ObjectCacheClient(srv.endpoint, srv.access_key, srv.secret_key, bucket="bench-transfer") as c, \
                ObjectCacheClient(srv.endpoint, srv.access_key, srv.secret_key, bucket="bench-transfer", direct=False) as relay:
            await c.ensure_bucket()
            async with s3_client(srv.endpoint, srv.access_key, srv.secret_key) as s3:
                for g, ctx, hit in progress(cases, desc="transfer"):
                    rows.append(await run_case(c, relay, s3, server, g, ctx, hit, args.scale, args.cold, args.repeats))
    finally:
        server[0].stop()
    return rows


def run(args: argparse.Namespace) -> dict:
    if args.quick:
        args.scale = 16
    rows = asyncio.run(run_all(args))
    scale = args.scale
    cache = "page cache dropped before every timed run" if args.cold else "warm page cache"
    note = rdma_note(args.ucx_logs)
    shutil.rmtree(args.ucx_logs, ignore_errors=True)
    print(f"\nBytes per token ÷{scale}; {cache}; median of {args.repeats} timed runs (slowest–fastest). "
          f"S3-range is timed once on {RANGE_SAMPLE_LAYERS} layers and scaled to 32. {note}\n")
    print_table(["G", "context", "hit", "path", "GB/s", "runs GB/s", "requests", "× opt-local", "× S3-CW", "× loopback-TCP"],
                [[r["chunk_tokens"], r["context"], r["hit"], p, f"{v['gb_per_s']:.2f}", f"{min(v['runs_gb_per_s']):.2f}–{max(v['runs_gb_per_s']):.2f}",
                  v["requests"], f"{v['vs_opt_local']:.2f}", f"{v['vs_s3_cw']:.2f}", f"{v['vs_loopback_tcp']:.2f}"]
                 for r in rows for p, v in r["paths"].items()])
    for r in rows:
        if "disk_direct" in r:
            depths = ", ".join(f"QD{q}: {v:.2f}" for q, v in r["disk_direct"]["gb_per_s_by_queue_depth"].items())
            shm = r["paths"]["ObjectCache-shm"]
            same = shm.get("vs_disk_direct_same_depth")
            print(f"\ndisk-direct (O_DIRECT, 1 MiB reads, GB/s by queue depth): {depths}; ObjectCache-shm cold is "
                  f"{shm['vs_disk_direct']:.0%} of the best" + (f" and {same:.0%} of QD{COLD_READ_DEPTH}, its own depth" if same else "")
                  + f"; run by run, {shm['vs_disk_direct_just_before']:.0%} (median) of the disk's rate measured just before it.")
            for i, run_ in enumerate(shm.get("cold_runs", [])):
                busy = "n/a" if run_["disk_busy"] is None else f"{run_['disk_busy']:.0%}"
                print(f"  cold shm run {i + 1}: {run_['gb_per_s']:.2f} GB/s, the disk's O_DIRECT QD{COLD_READ_DEPTH} just before "
                      f"{run_['disk_direct_just_before_gb_per_s']:.2f} GB/s; disk busy {busy} of the transfer; sampled page-cache hit ratio {run_['resident_sample']:.2f}; "
                      f"{run_['direct_read_bytes'] / 1e9:.2f} GB read O_DIRECT, {run_['read_ahead_bytes'] / 1e9:.2f} GB read into the page cache after")
    print("\nThe descriptor of each case (what the client encodes and the gateway and storage server decode):\n")
    print_table(["G", "context", "hit", "keys", "descriptor bytes", "encode µs / 1k keys", "decode µs / 1k keys"],
                [[r["chunk_tokens"], r["context"], r["hit"], r["descriptor"]["keys"], r["descriptor"]["bytes"],
                  f"{r['descriptor']['encode_us_per_1k_keys']:.0f}", f"{r['descriptor']['decode_us_per_1k_keys']:.0f}"] for r in rows])
    result = {"benchmark": "transfer", "quick": args.quick, "scale": scale, "cold": args.cold, "repeats": args.repeats, "rdma": note,
              "rows": rows, "targets": cold_targets(rows) if args.cold else targets(rows)}
    print_targets(result["targets"])
    return finish(args, result, plot)


def targets(rows: list[dict]) -> dict[str, bool]:
    """The benchmark issue's targets that this run's cases cover."""
    met = {}
    for r in rows:
        p, case = r["paths"], (r["chunk_tokens"], r["context"], r["hit"])
        if case == (16, 65536, 0.875):
            met["G=16 64K@87.5%: shm ≥ 70% of opt-local"] = p["ObjectCache-shm"]["vs_opt_local"] >= 0.70
            met["G=16 64K@87.5%: shm ≥ 40% of opt-local"] = p["ObjectCache-shm"]["vs_opt_local"] >= 0.40
            met["G=16 64K@87.5%: shm ≥ 5× S3-CW"] = p["ObjectCache-shm"]["vs_s3_cw"] >= 5
            met["G=16 64K@87.5%: shm ≥ 50× S3-range"] = p["ObjectCache-shm"]["gb_per_s"] >= 50 * p["S3-range"]["gb_per_s"]
            met["G=16 64K@87.5%: http ≥ 3× S3-CW"] = p["ObjectCache-http"]["vs_s3_cw"] >= 3
            met["G=16 64K@87.5%: http ≥ 50% of loopback TCP"] = p["ObjectCache-http"]["vs_loopback_tcp"] >= 0.5
        if case == (256, 65536, 0.875):
            met["G=256 64K@87.5%: shm ≥ 60% of opt-local"] = p["ObjectCache-shm"]["vs_opt_local"] >= 0.60
    return met


def cold_targets(rows: list[dict]) -> dict[str, bool]:
    """From a cold page cache, shm should read at the disk's own O_DIRECT limit: 90% of its best queue depth
    (measured after the runs), and 90% of the rate at the server's depth measured right before each run."""
    met = {}
    for r in rows:
        if "disk_direct" in r:
            case, shm = f"G={r['chunk_tokens']} {r['context'] // 1024}K@{r['hit']:.1%} cold", r["paths"]["ObjectCache-shm"]
            met[f"{case}: shm ≥ 90% of disk-direct (best depth)"] = shm["vs_disk_direct"] >= 0.9
            met[f"{case}: shm ≥ 90% of disk-direct at its own depth, measured just before each run"] = shm["vs_disk_direct_just_before"] >= 0.9
    return met


def plot(result: dict, fig) -> None:
    rows = result["rows"]
    ax = fig.subplots()
    grouped_bars(ax, [f"G{r['chunk_tokens']} {r['context'] // 1024}K@{r['hit']:.1%}" for r in rows],
                 {p: [r["paths"][p]["gb_per_s"] for r in rows] for p in rows[0]["paths"]}, rotation=45)
    ax.set_yscale("log")
    ax.set_ylabel("GB/s")
    ax.set_title(f"bench transfer (bytes per token ÷{result['scale']}{', cold page cache' if result.get('cold') else ''})")
    ax.legend()


def add_parser(sub) -> None:
    p = add_bench_parser(sub, "transfer", "opt-local vs S3-CW vs S3-range vs ObjectCache http/shm", run)
    p.add_argument("--scale", type=power_of_two, default=4, help="divide bytes per token by this (the full grid writes ~2.5 GB at 4)")
    p.add_argument("--only", metavar="G:CONTEXT:HIT", help="one case, e.g. 16:65536:0.875")
    p.add_argument("--cold", action="store_true", help="drop the page cache before every timed run and measure the disk's O_DIRECT limit (needs root)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per path (the median is reported, with the spread)")
