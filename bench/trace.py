"""``objectcache bench trace FILE``: replay a Mooncake-format trace through the layer-ready path.

Each request's ``hash_ids`` are 512-token prefix blocks (equal ids = shared
prefix). Block b becomes 512 deterministic token ids, the prompt becomes
chunk keys (``chunk_keys``, so shared blocks give shared keys), the longest
cached prefix is looked up, missing chunks are written (as a serving engine
would after prefill), and the hits are fetched layer by layer with the A100
compute model as the compute window. Requests start at ``timestamp /
compression`` and overlap. Bytes per token are divided by ``--scale`` and so
is the compute time, so each request needs the same bandwidth as full size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import numpy as np

from client_sdk import ObjectCacheClient, chunk_keys

from .compute_model import modelled_ttft, per_layer_seconds
from .harness import REPO, add_bench_parser, finish, llama_layout, power_of_two, print_table, progress, start_server

SAMPLE = Path(__file__).parent / "data" / "mooncake_synthetic_trace_sample.jsonl"
BLOCK_TOKENS = 512
PERCENTILES = (("p50", 50), ("p90", 90), ("p99", 99))


def block_tokens(block_id: int) -> np.ndarray:
    return (np.arange(BLOCK_TOKENS, dtype=np.uint64) + block_id * BLOCK_TOKENS) % 128_000


def _display_path(file: str) -> str:
    """The trace's path as recorded in results: repo-relative for bundled files (no machine paths)."""
    path = Path(file).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else file


def load_trace(path: Path, limit: int | None) -> list[dict]:
    out = []
    with open(path) as f:
        for i, line in enumerate(f):
            if limit is not None and i >= limit:
                break
            r = json.loads(line)
            for field in ("timestamp", "input_length", "hash_ids"):
                if field not in r:
                    raise ValueError(f"{path}:{i + 1}: missing {field!r}")
            out.append(r)
    return out


async def replay(args: argparse.Namespace) -> dict:
    trace = load_trace(Path(args.file), 60 if args.quick else None)
    scale = 128 if args.quick else args.scale
    max_tokens = 2048 if args.quick else args.max_tokens
    compression = 10.0 if args.quick else args.compression  # quick: the first 60 requests in 1.7 s
    layout = llama_layout(args.chunk_tokens, scale)
    srv = start_server()
    results = []
    moved = {"written": 0, "fetched": 0}
    try:
        async with ObjectCacheClient(srv.endpoint, srv.access_key, srv.secret_key, bucket="trace") as c:
            await c.ensure_bucket()
            start = time.perf_counter()

            async def one(req: dict) -> None:
                await asyncio.sleep(max(0.0, req["timestamp"] / 1000 / compression - (time.perf_counter() - start)))
                tokens = np.concatenate([block_tokens(b) for b in req["hash_ids"]])[: req["input_length"]]
                if max_tokens:
                    tokens = tokens[:max_tokens]
                keys = chunk_keys(tokens, layout.chunk_tokens, "llama-3.1-8b")
                hit = await c.lookup(keys)
                cached_tokens = hit * layout.chunk_tokens
                compute = per_layer_seconds(len(tokens), cached_tokens) / scale
                ttft = compute * layout.num_layers  # nothing cached: all compute
                if hit:
                    t0 = time.perf_counter()
                    arrivals = []
                    async with c.fetch_layers(keys[:hit], layout, args.transport, compute_window=compute, verify=False) as layers:
                        async for _ in layers:
                            arrivals.append(time.perf_counter() - t0)
                    ttft = modelled_ttft(arrivals, compute)
                    moved["fetched"] += layout.payload_bytes(hit)
                missing = keys[hit:]
                if missing:
                    blob = np.zeros(layout.chunk_bytes, np.uint8)
                    await c.put_chunks(missing, [blob] * len(missing), layout)
                    moved["written"] += layout.payload_bytes(len(missing))
                no_cache = per_layer_seconds(len(tokens), 0) / scale * layout.num_layers
                results.append({"tokens": len(tokens), "cached_tokens": cached_tokens, "ttft_s": ttft, "no_cache_ttft_s": no_cache})

            for done in progress(asyncio.as_completed([one(r) for r in trace]), total=len(trace), desc="trace"):
                await done
    finally:
        srv.stop()
    ttfts = np.array([r["ttft_s"] for r in results])
    total_tokens = sum(r["tokens"] for r in results)
    summary = {
        "benchmark": "trace", "quick": args.quick, "file": _display_path(args.file), "requests": len(results),
        "scale": scale, "chunk_tokens": layout.chunk_tokens, "compression": compression,
        "hit_ratio": sum(r["cached_tokens"] for r in results) / total_tokens,
        "bytes_written": moved["written"], "bytes_fetched": moved["fetched"],
        "ttft_s": {p: float(np.percentile(ttfts, q)) for p, q in PERCENTILES},
        "no_cache_ttft_s": {p: float(np.percentile([r["no_cache_ttft_s"] for r in results], q)) for p, q in PERCENTILES},
        "per_request": results,
    }
    return summary


def run(args: argparse.Namespace) -> dict:
    s = asyncio.run(replay(args))
    print(f"Trace replay: {s['requests']} requests from {Path(s['file']).name}, G={s['chunk_tokens']}, "
          f"bytes/token ÷{s['scale']:.0f} (compute ÷ the same), timestamps ÷{s['compression']}\n")
    print_table(["hit ratio", "bytes written", "bytes fetched"], [[f"{s['hit_ratio']:.3f}", s["bytes_written"], s["bytes_fetched"]]])
    print(f"\nModelled TTFT (s, compute ÷{s['scale']:.0f}), with the cache and with every token computed:\n")
    print_table(["", *(p for p, _ in PERCENTILES)],
                [[name, *(f"{s[k][p]:.4f}" for p, _ in PERCENTILES)] for name, k in (("ObjectCache", "ttft_s"), ("no cache", "no_cache_ttft_s"))])
    return finish(args, s, plot)


def plot(result: dict, fig) -> None:
    reqs = result["per_request"]
    left, right = fig.subplots(1, 2)
    ttft = np.sort([r["ttft_s"] for r in reqs])
    left.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft))
    left.set_xlabel("modelled TTFT (s)")
    left.set_ylabel("fraction of requests")
    left.set_title("TTFT CDF")
    right.scatter([r["tokens"] for r in reqs], [r["cached_tokens"] / r["tokens"] for r in reqs], s=8)
    right.set_xlabel("prompt tokens")
    right.set_ylabel("cached fraction")
    right.set_title(f"hit ratio {result['hit_ratio']:.3f}")
    fig.suptitle(f"bench trace: {result['requests']} requests, bytes per token ÷{result['scale']:.0f}")


def add_parser(sub) -> None:
    p = add_bench_parser(sub, "trace", "replay a Mooncake-format trace through the layer-ready path", run)
    p.add_argument("file", nargs="?", default=str(SAMPLE), help="trace (default: the bundled 200-request sample)")
    p.add_argument("--max-tokens", type=int, default=0, help="cap each prompt (0: no cap)")
    p.add_argument("--scale", type=power_of_two, default=128,
                   help="divide bytes per token (and compute) by this (power of two ≤ 1024); the full sample is ~6 GB at 128")
    p.add_argument("--chunk-tokens", type=int, default=64)
    p.add_argument("--compression", type=float, default=1.0,
                   help="divide trace timestamps by this (above what the machine sustains, TTFT measures the replay's own queueing)")
    p.add_argument("--transport", default="auto", choices=["auto", "shm", "http"])
