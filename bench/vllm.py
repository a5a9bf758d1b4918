"""``objectcache bench vllm``: TTFT of real vLLM with ObjectCache's connector, beside recompute and vLLM's own prefix hit.

vLLM's CPU build (CUDA where present) runs a locally built random-weight Llama (:mod:`.vllm_model`:
``--quick`` the tiny one, else ~0.5B so prefill dominates). For each prompt length and prefix hit
(50%, 87.5%), one process first stores the shared prefix through the connector; then each path
runs in a fresh engine process, warmed up on an unrelated prompt (a miss, then a hit on it), and
times one greedy token of each prompt (:mod:`.vllm_engine`):

* **recompute** — no cache: the whole prompt is prefilled;
* **local-hit** — vLLM's own prefix cache, the prefix already in engine memory (same process,
  ``enable_prefix_caching``): the best case, the paper's opt-local baseline;
* **shm / http / rdma** — ObjectCache's connector over that transport, loading the prefix an
  earlier process stored (rdma where this host has an RDMA engine).

First tokens are compared across paths (greedy: they must be equal). The headline figures are
ObjectCache's worst TTFT over the local hit's (``ttft_vs_local_hit_max``) and its smallest speed-up
over recompute (``speedup_vs_recompute_min``), over prompts of at least 1,024 tokens, for shm.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from objectcache.lifeline import spawn

from .harness import REPO, add_bench_parser, finish, grouped_bars, print_table, s3_client, start_server
from .vllm_engine import BLOCK, ENV
from .vllm_model import SIZES, build, vocabulary

HITS = (0.5, 0.875)
TRANSPORTS = ("shm", "http", "rdma")
BUCKET = "bench-vllm"
HEADLINE_MIN_TOKENS = 1024


def _prompts(lengths: list[int], vocab: int, seed: int = 11) -> dict[int, dict]:
    """Per length: the stored base and, per hit, a prompt sharing ``hit·T`` tokens of it (then fresh tokens)."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in lengths:
        base = rng.integers(3, vocab, size=t).tolist()
        per_hit = {h: base[: int(t * h)] + rng.integers(3, vocab, size=t - int(t * h)).tolist() for h in HITS}
        out[t] = {"base": base, "prompts": per_hit, "warm": rng.integers(3, vocab, size=t).tolist()}
    return out


def _engine(spec: dict, workdir: Path, timeout: float) -> dict:
    path = workdir / f"spec-{time.monotonic_ns()}.json"
    path.write_text(json.dumps(spec))
    # spawn: the engine ends with this benchmark even when a timeout SIGKILLs it (subprocess.run's kill reaches only us).
    proc = spawn([sys.executable, "-m", "bench.vllm_engine", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                 env={**os.environ, **ENV, "PYTHONPATH": str(REPO)})
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"vLLM engine ({spec['path']}) failed:\n{(stdout + stderr)[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


async def _prune(srv, keep: set[str]) -> int:
    """Delete every object but the stored prefixes: a connector process saves its prompts' other blocks,
    which the next path's process would otherwise load too."""
    async with s3_client(srv.endpoint, srv.access_key, srv.secret_key) as s3:
        gone = []
        async for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            gone += [o["Key"] for o in page.get("Contents", []) if o["Key"] not in keep]
        for i in range(0, len(gone), 1000):
            await s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in gone[i:i + 1000]]})
        return len(gone)


def _steps(cases: dict[int, dict], path: str) -> tuple[list[dict], list[tuple[int, float]]]:
    """One warm-up, then for each (length, hit): a primer (local-hit only) and the timed prompt."""
    first = next(iter(cases.values()))
    half = len(first["warm"]) // 2 // BLOCK * BLOCK
    # Two warm-ups: a miss, then a hit on its first half (in engine memory, or loaded through the connector
    # from what the first one saved), so the first timed prompt does not pay for a code path's first use.
    steps = [{"prompt": first["warm"], "timed": False}, {"prompt": first["warm"][:half] + first["prompts"][HITS[0]][half:], "timed": False}]
    order = []
    for t, case in cases.items():
        for h in HITS:
            if path == "local":
                hit_tokens = case["prompts"][h][: int(t * h)]
                steps.append({"prompt": hit_tokens + case["warm"][: max(1, t - len(hit_tokens))], "timed": False})
            steps.append({"prompt": case["prompts"][h], "timed": True})
            order.append((t, h))
    return steps, order


def run(args: argparse.Namespace) -> dict:
    from client_sdk.rdma import rdma_available
    from client_sdk.sync import SyncObjectCacheClient
    from client_sdk.vllm_connector.config import ConnectorConfig, namespace

    size = SIZES["tiny" if args.quick else args.model]
    lengths = [1024] if args.quick else [int(x) for x in args.lengths.split(",")]
    repeats = 1 if args.quick else args.repeats
    bad = [t for t in lengths if t % 256 or t < 256]
    if bad:
        raise SystemExit(f"--lengths: {bad} are not multiples of 256 (hits must end on {BLOCK}-token blocks)")
    workdir = Path(tempfile.mkdtemp(prefix="objectcache-bench-vllm-"))
    model = str(build(args.model_dir or workdir, size))
    max_len = max(lengths) * 2
    common = {"model": model, "max_model_len": max_len, "kv_bytes": max(32 << 20, 4 * max_len * size.kv_bytes_per_token())}
    # --quick (make test's smoke run) starts one connector process, over shm: engine start-up is most of its time.
    wanted = ("shm",) if args.quick else tuple(args.transports.split(","))
    transports = [t for t in wanted if t != "rdma" or rdma_available()[0]]
    skipped = {t: ("not in --quick" if args.quick else "not in --transports") if t not in wanted else rdma_available()[1]
               for t in TRANSPORTS if t not in transports}
    cases = _prompts(lengths, vocabulary(model))
    srv = start_server()
    try:
        extra = {"endpoint": srv.endpoint, "access_key": srv.access_key, "secret_key": srv.secret_key, "bucket": BUCKET}
        # The prefix, stored by an earlier process (its blocks: every full block of each base).
        _engine({**common, "path": "connector", "extra_config": {**extra, "transport": "shm"},
                 "steps": [{"prompt": c["base"], "timed": False} for c in cases.values()]}, workdir, args.timeout)
        ns = namespace(ConnectorConfig("http://unused", "a", "b"), model, "float32", 0, 1, block_size=BLOCK, layout="kv")
        from client_sdk import chunk_keys

        stored: set[str] = set()
        with SyncObjectCacheClient(srv.endpoint, srv.access_key, srv.secret_key, BUCKET) as sdk:
            for c in cases.values():
                keys = chunk_keys(c["base"], BLOCK, ns)[: (len(c["base"]) - 1) // BLOCK]
                if sdk.lookup(keys) < len(keys):
                    raise RuntimeError(f"the store process left {sdk.lookup(keys)} of {len(keys)} prefix chunks")
                stored.update(keys)
        paths = {"recompute": {"path": "recompute"}, "local-hit": {"path": "local"},
                 **{t: {"path": "connector", "extra_config": {**extra, "transport": t, "overlap": args.overlap}} for t in transports}}
        runs: dict[str, list[list[dict]]] = {p: [] for p in paths}
        for _ in range(repeats):
            for name, spec in paths.items():
                steps, order = _steps(cases, spec["path"])
                runs[name].append(_engine({**common, **spec, "steps": steps}, workdir, args.timeout)["steps"])
                if spec["path"] == "connector":
                    asyncio.run(_prune(srv, stored))
    finally:
        srv.stop()
    rows = []
    for i, (t, h) in enumerate(order):
        row = {"tokens": t, "hit": h, "paths": {}}
        for name in paths:
            samples = [r[i] for r in runs[name]]
            row["paths"][name] = {"ttft_s": statistics.median(s["ttft_s"] for s in samples), "runs_s": [s["ttft_s"] for s in samples],
                                  "first_token": samples[0]["token"], "cached_tokens": samples[0]["cached"]}
        base, local = row["paths"]["recompute"]["ttft_s"], row["paths"]["local-hit"]["ttft_s"]
        for name in transports:
            p = row["paths"][name]
            p["vs_local_hit"], p["speedup_vs_recompute"] = p["ttft_s"] / local, base / p["ttft_s"]
        row["tokens_identical"] = len({p["first_token"] for p in row["paths"].values()}) == 1
        rows.append(row)
    return _report(args, size, rows, transports, skipped)


def _report(args: argparse.Namespace, size, rows: list[dict], transports: list[str], skipped: dict[str, str]) -> dict:
    names = ["recompute", "local-hit", *transports]
    print(f"\nvLLM TTFT (one greedy token), random-weight Llama '{size.name}' (~{size.parameters / 1e9:.2f}B parameters), "
          f"{'median of %d fresh processes' % args.repeats if not args.quick else 'one process'} per path; "
          "cached = tokens vLLM reports as cached (local or loaded).\n")
    print_table(["tokens", "hit", *(f"{n} s (cached)" for n in names), "shm / local-hit", "shm speed-up", "first tokens equal"],
                [[r["tokens"], f"{r['hit']:.1%}", *(f"{r['paths'][n]['ttft_s']:.3f} ({r['paths'][n]['cached_tokens']})" for n in names),
                  f"{r['paths']['shm']['vs_local_hit']:.3f}", f"{r['paths']['shm']['speedup_vs_recompute']:.2f}×", r["tokens_identical"]]
                 for r in rows])
    headline = [r for r in rows if r["tokens"] >= HEADLINE_MIN_TOKENS]
    result = {
        "benchmark": "vllm", "quick": args.quick, "model": {"size": size.name, "parameters": size.parameters, "layers": size.layers},
        "device": _device(), "overlap": args.overlap, "transports_skipped": skipped, "rows": rows,
        "ttft_vs_local_hit_max": max(r["paths"]["shm"]["vs_local_hit"] for r in headline),
        "speedup_vs_recompute_min": min(r["paths"]["shm"]["speedup_vs_recompute"] for r in headline),
        "tokens_identical": all(r["tokens_identical"] for r in rows),
    }
    for t, why in skipped.items():
        print(f"\n{t}: not run ({why})")
    print(f"\nshm over ≥ {HEADLINE_MIN_TOKENS} tokens: TTFT at most {result['ttft_vs_local_hit_max']:.3f}× vLLM's own in-memory hit "
          f"(target ≤ 1.05: {'met' if result['ttft_vs_local_hit_max'] <= 1.05 else 'MISSED'}), at least "
          f"{result['speedup_vs_recompute_min']:.2f}× faster than recompute; first tokens identical: {result['tokens_identical']}")
    return finish(args, result, _plot)


def _device() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores visible)"
    except Exception:  # noqa: BLE001 — a label only
        return "CPU"


def _plot(result: dict, fig) -> None:
    rows = result["rows"]
    names = [n for n in rows[0]["paths"]]
    ax = fig.subplots()
    grouped_bars(ax, [f"{r['tokens']}@{r['hit']:.1%}" for r in rows], {n: [r["paths"][n]["ttft_s"] * 1000 for r in rows] for n in names})
    ax.set_ylabel("TTFT (ms)")
    ax.set_title(f"bench vllm ({result['model']['size']}, {result['device']})")
    ax.legend()


def _transports(value: str) -> str:
    names = [t for t in value.split(",") if t]
    unknown = sorted(set(names) - set(TRANSPORTS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown transports {unknown} (known: {', '.join(TRANSPORTS)})")
    return ",".join(["shm", *(t for t in TRANSPORTS if t in names and t != "shm")])


def add_parser(sub) -> None:
    p = add_bench_parser(sub, "vllm", "TTFT of real vLLM: ObjectCache's connector vs recompute vs vLLM's own prefix hit", run)
    p.add_argument("--model", choices=sorted(SIZES), default="0.5b", help="the random-weight Llama to build (--quick: tiny)")
    p.add_argument("--model-dir", help="where built models are kept (reused across runs); default: a temporary directory")
    p.add_argument("--lengths", default="512,1024,2048,3072", help="prompt lengths in tokens, multiples of 256")
    p.add_argument("--transports", default=",".join(TRANSPORTS), type=_transports,
                   help="the connector's transports to time (shm is the headline and always runs)")
    p.add_argument("--repeats", type=int, default=3, help="fresh processes per path (the median is reported)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one engine process may take")
    p.add_argument("--overlap", choices=("auto", "layerwise", "whole"), default="auto",
                   help="the connector's overlap setting for the timed loads (auto: whole loads first on vLLM's CPU backend)")
