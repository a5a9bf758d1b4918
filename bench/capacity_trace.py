"""The trace half of ``bench capacity``: a Mooncake trace replayed through one capacity-tier node whose cache is smaller than the trace.

Each request does what ``bench trace`` does (lookup, a layer-ready fetch of the hit with
the A100 model's compute as its window, a put of the miss), against a node whose chunks
live in the upstream and whose local cache holds ``cache.max_bytes``. Of the chunks the
kv-gets ask for, the node serves some from its cache (*local hit ratio*) and fetches the
rest from the upstream (*upstream hit ratio* = chunks fetched from the upstream / chunks
requested, counted by the node itself); the two add up to 1. The same replay with a
cache larger than the working set runs beside it as the reference.

A request whose first chunk an earlier request also stored (the same conversation or system
prompt) starts once that request's put has landed, as a next turn starts after the answer
before it: on a compressed clock and a loaded machine every lookup could otherwise come
before any put and the trace would measure nothing.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from client_sdk import KVLayout, ObjectCacheClient, chunk_keys
from protocol.errors import ErrorCode, S3Error

from .compute_model import modelled_ttft, per_layer_seconds
from .harness import BenchServer, progress
from .trace import PERCENTILES, block_tokens
from .upstreams import Upstream

MODEL = "llama-3.1-8b"


def prompt_keys(trace: list[dict], layout: KVLayout, max_tokens: int) -> list[tuple[int, list[str]]]:
    """Every request's (prompt tokens, chunk keys), the prompt capped at ``max_tokens`` (0: no cap)."""
    out = []
    for req in trace:
        tokens = np.concatenate([block_tokens(b) for b in req["hash_ids"]])[: req["input_length"]]
        if max_tokens:
            tokens = tokens[:max_tokens]
        out.append((len(tokens), chunk_keys(tokens, layout.chunk_tokens, MODEL)))
    return out


def working_set_bytes(prompts: list[tuple[int, list[str]]], layout: KVLayout) -> int:
    """Bytes of the distinct chunks the whole trace stores."""
    return len({k for _, keys in prompts for k in keys}) * layout.chunk_bytes


def follows(prompts: list[tuple[int, list[str]]]) -> list[int | None]:
    """For each request, the latest earlier one with the same first chunk (None: it starts on its own)."""
    last: dict[str, int] = {}
    out: list[int | None] = []
    for i, (_, keys) in enumerate(prompts):
        out.append(last.get(keys[0]) if keys else None)
        if keys:
            last[keys[0]] = i
    return out


def chunk_requests(up: Upstream, bucket: str, since: int) -> dict[str, int] | None:
    """Upstream chunk GETs and HEADs after request number ``since`` (None where the upstream keeps no log)."""
    log = up.requests()
    if log is None:
        return None
    mine = [(m, p) for m, p in log[since:] if p.startswith(f"/{bucket}/") and not p.startswith(f"/{bucket}/.objectcache")]
    return {"get": sum(m == "GET" for m, _ in mine), "head": sum(m == "HEAD" for m, _ in mine), "put": sum(m == "PUT" for m, _ in mine)}


async def replay(node: BenchServer, up: Upstream, bucket: str, trace: list[dict], prompts: list[tuple[int, list[str]]], layout: KVLayout,
                 scale: int, compression: float, transport: str) -> dict:
    """Replay ``trace`` through ``node`` into ``bucket``; hit ratios from the node's own counters, TTFT from the compute model."""
    results: list[dict] = []
    counts = {"requested": 0, "failed_fetches": 0}
    async with ObjectCacheClient(node.endpoint, node.access_key, node.secret_key, bucket=bucket) as c:
        await c.ensure_bucket()
        log_start = len(up.requests() or [])
        before = node.status()["chunk_cache"]
        start = time.perf_counter()
        stored = [asyncio.Event() for _ in prompts]
        waits_for = follows(prompts)

        async def one(i: int, req: dict, n_tokens: int, keys: list[str]) -> None:
            try:
                await asyncio.sleep(max(0.0, req["timestamp"] / 1000 / compression - (time.perf_counter() - start)))
                if waits_for[i] is not None:
                    await stored[waits_for[i]].wait()
                await request(n_tokens, keys)
            finally:
                stored[i].set()

        async def request(n_tokens: int, keys: list[str]) -> None:
            hit = await c.lookup(keys)
            compute = per_layer_seconds(n_tokens, hit * layout.chunk_tokens) / scale
            no_cache = per_layer_seconds(n_tokens, 0) / scale * layout.num_layers
            ttft = compute * layout.num_layers
            arrivals: list[float] = []
            if hit:
                t0 = time.perf_counter()
                try:
                    async with c.fetch_layers(keys[:hit], layout, transport, compute_window=compute, verify=False) as layers:
                        async for _ in layers:
                            arrivals.append(time.perf_counter() - t0)
                    ttft = modelled_ttft(arrivals, compute)
                    counts["requested"] += hit
                except S3Error as e:  # the cache full of other requests' pinned chunks: compute everything, as an engine would
                    if e.code != ErrorCode.ServiceUnavailable:
                        raise
                    counts["failed_fetches"] += 1
                    hit, ttft = 0, no_cache
            if keys[hit:]:
                await c.put_chunks(keys[hit:], [np.zeros(layout.chunk_bytes, np.uint8)] * len(keys[hit:]), layout)
            results.append({"tokens": n_tokens, "cached_tokens": hit * layout.chunk_tokens, "ttft_s": ttft, "no_cache_ttft_s": no_cache,
                            "fetch_s": arrivals[-1] if hit else 0.0})

        jobs = [one(i, r, n, k) for i, (r, (n, k)) in enumerate(zip(trace, prompts))]
        for done in progress(asyncio.as_completed(jobs), total=len(jobs), desc=f"trace {bucket}"):
            await done
        after = node.status()["chunk_cache"]
    fetched = after["fetched"] - before["fetched"]
    requested = counts["requested"]
    ttfts = np.array([r["ttft_s"] for r in results])
    return {
        "cache_max_bytes": after["max_bytes"], "cache_bytes_at_end": after["bytes"], "evicted": after["evicted"] - before["evicted"],
        "requests": len(results), "failed_fetches": counts["failed_fetches"],
        "prefix_hit_ratio": sum(r["cached_tokens"] for r in results) / sum(r["tokens"] for r in results),
        "chunks_requested": requested, "chunks_from_upstream": fetched,
        "local_hit_ratio": (requested - fetched) / requested if requested else None,
        "upstream_hit_ratio": fetched / requested if requested else None,
        "upstream_requests": chunk_requests(up, bucket, log_start),
        "ttft_s": {p: float(np.percentile(ttfts, q)) for p, q in PERCENTILES},
        "no_cache_ttft_s": {p: float(np.percentile([r["no_cache_ttft_s"] for r in results], q)) for p, q in PERCENTILES},
        "per_request": results,
    }
