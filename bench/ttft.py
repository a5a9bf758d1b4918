"""``objectcache bench ttft``: time to first token of a serving loop that computes as layers land.

For each (G, context, hit) the same prefix is loaded five ways and a serving
loop computes layer ℓ as soon as it is usable (the A100 model of
``compute_model`` by default, or real matmuls with ``--compute torch``):

* **opt-local-LW** — KV already layer-major in local memory: a copy per layer into the destination;
* **Local-CW** — chunk objects in local memory, all gathered into layer-major first, then compute;
* **Local-LW** — chunk objects in local memory, gathered layer by layer while earlier layers compute;
* **S3-CW** — one aiobotocore GET per chunk object through the gateway (concurrency 16), then compute;
* **ObjectCache-LW** — one descriptor; the storage server writes each layer into a registered
  ``shm`` region and the loop computes on it when its frame arrives.

The deadline column (:mod:`.ttft_deadline`): ObjectCache-LW on a slow node under a load budget.

Local loaders run in a thread (numpy copies release the GIL), so loading and
compute overlap as they would with a copy engine. Each path's TTFT is the median of
``--repeats`` runs (with the spread); for ObjectCache-LW the median run's per-layer
timeline is kept: the server's setup (decode, pin, plan) and each layer's read
start/end and ready times, and the client's arrival and wait for each layer, so a
stall shows where it comes from. ``--scale k`` divides the
bytes per token *and* the compute times by k: every configuration needs the
same bandwidth (bytes per second of compute) as at full size.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections.abc import Awaitable, Callable

import numpy as np

from client_sdk import KVLayout, ObjectCacheClient, chunk_keys

from .compute_model import NUM_LAYERS, ModelledGPU, per_layer_seconds
from .harness import add_bench_parser, finish, grouped_bars, llama_layout, power_of_two, print_table, print_targets, progress, s3_client, start_server
from .transfer import s3_cw
from .ttft_deadline import DeadlineCase, measure_deadline
from .ttft_deadline import report as deadline_report

PATHS = ("opt-local-LW", "Local-CW", "Local-LW", "S3-CW", "ObjectCache-LW")
CONTEXTS = (4096, 16384, 65536)
HITS = (0.5, 0.875)
G_VALUES = (16, 64, 256)
# The targets from the benchmark issue: overhead over opt-local-LW.
TARGET_OVERHEAD = {65536: 0.03, 16384: 0.10}

Compute = Callable[[int], Awaitable[None]]


# -- compute ------------------------------------------------------------------------
def model_compute(gpu: ModelledGPU, seconds_per_layer: float) -> Compute:
    async def compute(layer: int) -> None:
        await gpu.compute(seconds_per_layer)
    return compute


def require_torch_gpu() -> None:
    try:
        import torch
    except ImportError:
        raise SystemExit("--compute torch needs PyTorch (pip install torch); the default model needs nothing") from None
    if not torch.cuda.is_available():
        raise SystemExit("--compute torch needs a CUDA GPU and none is visible; use the default A100 model instead")


def torch_compute(context: int, cached: int, scale: int) -> Compute:
    """Llama 3.1 8B layer shapes on a CUDA GPU: QKV/O projections, attention of the miss
    tokens over the whole context, and the gated MLP (miss tokens divided by ``scale``).
    Written for GPUs; this project's CI machines have none, so it is exercised only where one exists."""
    import torch

    dev, dt = torch.device("cuda"), torch.bfloat16
    m, n = max((context - cached) // scale, 1), context  # ÷scale tokens: linear and attention work ÷scale
    x = torch.randn(m, 4096, device=dev, dtype=dt)
    w_qkv, w_o = torch.randn(4096, 6144, device=dev, dtype=dt), torch.randn(4096, 4096, device=dev, dtype=dt)
    w_up, w_down = torch.randn(4096, 2 * 14336, device=dev, dtype=dt), torch.randn(14336, 4096, device=dev, dtype=dt)
    k = torch.randn(32, n, 128, device=dev, dtype=dt)

    def layer() -> None:
        q = (x @ w_qkv)[:, :4096].view(m, 32, 128).transpose(0, 1)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=False)
        h = a.transpose(0, 1).reshape(m, 4096) @ w_o
        up = h @ w_up
        _ = (torch.nn.functional.silu(up[:, :14336]) * up[:, 14336:]) @ w_down
        torch.cuda.synchronize()

    async def compute(index: int) -> None:
        await asyncio.to_thread(layer)
    return compute


# -- loaders ------------------------------------------------------------------------
class ThreadLoader:
    """Copies layers on a thread and signals each one to the event loop as it lands."""

    def __init__(self, num_layers: int, copy_layer: Callable[[int], None]) -> None:
        self.loop = asyncio.get_running_loop()
        self.ready = [asyncio.Event() for _ in range(num_layers)]
        self.thread = threading.Thread(target=self._run, args=(copy_layer,), daemon=True)

    def _run(self, copy_layer: Callable[[int], None]) -> None:
        for i, ev in enumerate(self.ready):
            copy_layer(i)
            self.loop.call_soon_threadsafe(ev.set)

    async def __aenter__(self) -> "ThreadLoader":
        self.thread.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.thread.join)


async def serve_layerwise(loader: ThreadLoader, compute: Compute) -> None:
    async with loader:
        for i, ev in enumerate(loader.ready):
            await ev.wait()
            await compute(i)


async def compute_all(compute: Compute) -> None:
    for i in range(NUM_LAYERS):
        await compute(i)


class Case:
    """One (G, context, hit): the chunk objects in memory and in the store, and every path's loop."""

    def __init__(self, layout: KVLayout, keys: list[str], chunks: np.ndarray, compute: Compute, compute_window: float,
                 client: ObjectCacheClient, s3) -> None:
        self.layout, self.keys, self.client, self.s3 = layout, keys, client, s3
        self.compute, self.compute_window = compute, compute_window
        n, s = len(keys), layout.per_layer_chunk_bytes
        self.chunks = chunks.reshape(n, layout.num_layers, s)  # chunk objects, chunk-major
        self.layer_major = np.ascontiguousarray(self.chunks.transpose(1, 0, 2))
        self.dest = np.empty((layout.num_layers, n, s), np.uint8)
        self.timeline: dict = {}  # ObjectCache-LW's last run, see timeline_of

    async def opt_local_lw(self) -> None:
        await serve_layerwise(ThreadLoader(self.layout.num_layers, lambda i: np.copyto(self.dest[i], self.layer_major[i])), self.compute)

    async def local_cw(self) -> None:
        await asyncio.to_thread(np.copyto, self.dest, self.chunks.transpose(1, 0, 2))
        await compute_all(self.compute)

    async def local_lw(self) -> None:
        await serve_layerwise(ThreadLoader(self.layout.num_layers, lambda i: np.copyto(self.dest[i], self.chunks[:, i, :])), self.compute)

    async def s3_cw(self) -> None:
        await s3_cw(self.s3, self.client.bucket, self.keys, self.layout, self.dest.reshape(-1))
        await compute_all(self.compute)

    async def objectcache_lw(self) -> None:
        waits: list[float] = []
        t = time.perf_counter()  # layer 0's wait includes the request
        async with self.client.fetch_layers(self.keys, self.layout, "shm", mode="layerwise",
                                            compute_window=self.compute_window) as layers:
            stream = aiter(layers)
            for i in range(self.layout.num_layers):
                if i:
                    t = time.perf_counter()
                index, _view = await anext(stream)
                waits.append(time.perf_counter() - t)
                await self.compute(index)
            async for _ in stream:  # the END frame: the server's report
                pass
        self.timeline = timeline_of(layers.stats, waits)

    def paths(self) -> dict[str, Callable[[], Awaitable[None]]]:
        return dict(zip(PATHS, (self.opt_local_lw, self.local_cw, self.local_lw, self.s3_cw, self.objectcache_lw)))


def timeline_of(stats, waits: list[float]) -> dict:
    """One ObjectCache-LW run, layer by layer. Server times count from the transfer's start (after
    ``setup_s``: decode, pin, plan); the client's from its request; ``consumer_wait_s``: how long the
    serving loop waited for the layer after computing the one before (layer 0: from the request)."""
    server = stats.server.layer_timeline or [[0.0, 0.0, 0.0]] * len(waits)
    return {
        "setup_s": stats.server.setup_s, "first_layer_s": stats.first_layer_s or 0.0, "consumer_wait_s": sum(waits),
        "layers": [{"read_start_s": r[0], "read_end_s": r[1], "ready_s": r[2], "arrival_s": a, "consumer_wait_s": w}
                   for r, a, w in zip(server, stats.layer_arrival_s, waits)],
    }


async def measure(case: Case, repeats: int) -> tuple[dict[str, list[float]], dict]:
    """Each path's TTFT in each of ``repeats`` runs (after one warm-up of the network paths), and
    ObjectCache-LW's timeline of its median run."""
    out: dict[str, list[float]] = {}
    timelines: list[dict] = []
    for name, run in case.paths().items():
        if name in ("S3-CW", "ObjectCache-LW"):
            await run()  # warm the page cache and the connections, as a serving engine would be
        out[name] = []
        for _ in range(repeats):
            t = time.perf_counter()
            await run()
            out[name].append(time.perf_counter() - t)
            if name == "ObjectCache-LW":
                timelines.append(case.timeline)
    runs = out["ObjectCache-LW"]
    return out, timelines[sorted(range(len(runs)), key=runs.__getitem__)[len(runs) // 2]]


async def run_all(args: argparse.Namespace) -> list[dict]:
    scale, repeats = args.scale, args.repeats
    gs = (64,) if args.quick else G_VALUES
    contexts = (4096,) if args.quick else CONTEXTS
    if args.only:
        g, ctx = (int(v) for v in args.only.split(":"))
        gs, contexts = (g,), (ctx,)
    srv = start_server()
    gpu = ModelledGPU()
    rows: list[dict] = []
    try:
        async with ObjectCacheClient(srv.endpoint, srv.access_key, srv.secret_key, bucket="bench-ttft") as c:
            await c.ensure_bucket()
            async with s3_client(srv.endpoint, srv.access_key, srv.secret_key) as s3:
                cases = [(g, ctx) for g in gs for ctx in contexts]
                for g, ctx in progress(cases, desc="ttft"):
                    layout = llama_layout(g, scale)
                    rng = np.random.default_rng(g * 7 + ctx)
                    n_max = int(ctx * max(HITS)) // g
                    keys = chunk_keys(rng.integers(0, 128_000, ctx), g, f"ttft-{ctx}")[:n_max]
                    chunks = rng.integers(0, 256, (n_max, layout.chunk_bytes), dtype=np.uint8)
                    await c.put_chunks(keys, list(chunks), layout)  # the larger hit; the smaller is its prefix
                    for hit in HITS:
                        n = int(ctx * hit) // g
                        cached = n * g
                        window = per_layer_seconds(ctx, cached) / scale
                        compute = torch_compute(ctx, cached, scale) if args.compute == "torch" else model_compute(gpu, window)
                        case = Case(layout, keys[:n], chunks[:n], compute, window, c, s3)
                        runs, timeline = await measure(case, repeats)
                        deadline = await measure_deadline(DeadlineCase(layout, keys[:n], ctx, scale), list(chunks[:n]), gpu)
                        ttft = {p: statistics.median(r) for p, r in runs.items()}
                        base = ttft["opt-local-LW"]
                        rows.append({
                            "chunk_tokens": g, "context": ctx, "hit": hit, "chunks": n, "payload_bytes": layout.payload_bytes(n),
                            "compute_per_layer_s": window,
                            "paths": {p: {"ttft_s": t, "runs_s": runs[p], "overhead_vs_opt_local_lw": t / base - 1} for p, t in ttft.items()},
                            "timeline": timeline, "deadline": deadline,
                        })
                        del case
    finally:
        gpu.close()
        srv.stop()
    return rows


def targets(rows: list[dict]) -> dict[str, bool]:
    """Which of the issue's targets held in this run."""
    met = {}
    for ctx, limit in TARGET_OVERHEAD.items():
        sel = [r for r in rows if r["context"] == ctx]
        if sel:
            met[f"ObjectCache-LW overhead ≤ {limit:.0%} at {ctx // 1024}K"] = all(
                r["paths"]["ObjectCache-LW"]["overhead_vs_opt_local_lw"] <= limit for r in sel)
    met["ObjectCache-LW beats S3-CW everywhere"] = all(
        r["paths"]["ObjectCache-LW"]["ttft_s"] < r["paths"]["S3-CW"]["ttft_s"] for r in rows)
    return met


def plot(result: dict, fig) -> None:
    rows = result["rows"]
    ax = fig.subplots()
    grouped_bars(ax, [f"G{r['chunk_tokens']} {r['context'] // 1024}K@{r['hit']:.1%}" for r in rows],
                 {p: [r["paths"][p]["overhead_vs_opt_local_lw"] * 100 for r in rows] for p in PATHS}, rotation=45)
    ax.set_yscale("symlog", linthresh=10)
    ax.set_ylabel("TTFT overhead over opt-local-LW (%)")
    ax.set_title(f"bench ttft (bytes and compute ÷{result['scale']}, compute: {result['compute']})")
    ax.legend()


def run(args: argparse.Namespace) -> dict:
    if args.compute == "torch":
        require_torch_gpu()
    if args.quick:
        args.scale, args.repeats = 64, 1
    rows = asyncio.run(run_all(args))
    scale = args.scale
    print(f"\nTTFT per path; bytes per token and compute ÷{scale}; compute model: {args.compute}; "
          f"median of {args.repeats} runs (overhead of the median; spread of ObjectCache-LW's runs in its own column).\n")
    print_table(["G", "context", "hit", "compute/layer ms", *(f"{p} s (overhead)" for p in PATHS), "ObjectCache-LW runs s"],
                [[r["chunk_tokens"], r["context"], r["hit"], f"{r['compute_per_layer_s'] * 1000:.2f}",
                  *(f"{v['ttft_s']:.3f} ({v['overhead_vs_opt_local_lw']:+.1%})" for v in r["paths"].values()),
                  f"{min(r['paths']['ObjectCache-LW']['runs_s']):.3f}–{max(r['paths']['ObjectCache-LW']['runs_s']):.3f}"] for r in rows])
    print("\nObjectCache-LW's median run: server setup (decode, pin, plan), first layer usable at the client, "
          "the serving loop's total wait, the layers it waited > 0.5 ms for, and the slowest layer read:\n")
    print_table(["G", "context", "hit", "setup ms", "first layer ms", "loop wait ms", "layers waited", "slowest read ms"],
                [[r["chunk_tokens"], r["context"], r["hit"], f"{r['timeline']['setup_s'] * 1000:.1f}", f"{r['timeline']['first_layer_s'] * 1000:.1f}",
                  f"{r['timeline']['consumer_wait_s'] * 1000:.1f}", sum(x["consumer_wait_s"] > 5e-4 for x in r["timeline"]["layers"]),
                  f"{max(x['read_end_s'] - x['read_start_s'] for x in r['timeline']['layers']) * 1000:.1f}"] for r in rows])
    flagship = max(rows, key=lambda r: (r["context"], r["hit"], -r["chunk_tokens"]))
    print(f"\nPer-layer timeline of G={flagship['chunk_tokens']} {flagship['context'] // 1024}K@{flagship['hit']:.1%} (ms; server from the "
          "transfer's start, client from its request):\n")
    print_table(["layer", "read start", "read end", "ready", "client arrival", "loop wait"],
                [[i, *(f"{x[k] * 1000:.1f}" for k in ("read_start_s", "read_end_s", "ready_s", "arrival_s", "consumer_wait_s"))]
                 for i, x in enumerate(flagship["timeline"]["layers"])])
    met = {**targets(rows), **deadline_report(rows)}
    print_targets(met)
    result = {"benchmark": "ttft", "quick": args.quick, "scale": scale, "compute": args.compute, "rows": rows, "targets": met}
    return finish(args, result, plot)


def add_parser(sub) -> None:
    p = add_bench_parser(sub, "ttft", "TTFT of a layer-ready serving loop: opt-local/Local/S3/ObjectCache", run)
    p.add_argument("--scale", type=power_of_two, default=8, help="divide bytes per token and compute time by this (power of two)")
    p.add_argument("--compute", choices=["model", "torch"], default="model",
                   help="per-layer compute: the A100 model (default) or real matmuls on a CUDA GPU")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per path (the median is reported, with the spread)")
    p.add_argument("--only", metavar="G:CONTEXT", help="one (G, context), e.g. 16:65536")
