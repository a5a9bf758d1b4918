"""``bench cluster``'s oracle case: the delivery-time oracle and the path scheduler on three real nodes.

Three cluster nodes (A, B, C: one zone, each in a rack of its own, so every peer link is the same-zone
tier) over one upstream, each node's sending to its peers paced to ``--peer-mbps`` (its NIC,
``cluster.serve_max_bytes_per_s``, and the tier map's ``same_zone_gbps`` says the same). The upstream's
per-GET time and how many GETs it serves at once are measured first and configured
(``upstream_first_byte_ms``, ``upstream_store_streams``): an operator's calibration, not a fit to the results.

A replayed trace (the bundled Mooncake-format sample's prompt lengths, each request with probability 0.6
the next turn of an earlier one: its whole prefix plus a few blocks; a block is one chunk, so requests
sharing a prefix share chunks; every chunk starts in the upstream only) is sent request by
request to A, B, C in turn. For each request the node is first asked ``kv-estimate`` for its own host
(the oracle's predicted time to the first layer), then the kv-get runs. Three trios of nodes run side by
side, each with another ``cluster.path_choice`` and its own bucket: ``scheduler`` (the path scheduler),
``peer-first`` (path choice off: the longest warm run, then the upstream) and ``upstream`` (no peers);
request i runs on each trio in turn before request i + 1, so all three see the same moment of the
machine's load.

* ``oracle_first_layer_error_p50`` — median over the scheduler replay's requests (after the first
  ``WARMUP`` that teach the nodes their fixed costs) of |predicted − measured| / measured first layer,
  measured as the node's own setup plus first-layer time (END statistics).
* ``path_regret_p50`` — median over requests of the scheduler's path's kv-get time over the best path's for
  the same request, minus one (the best path in hindsight, measured), a path being the kinds of source its
  chunks came from and its time the mean of the replays that took it (:func:`path_regret`: two replays on one
  path are two samples of it, not a choice). ``choice_regret_p50``: the same over the requests whose replays
  took different paths; ``sample_regret_p50``: against the fastest replay's time, whatever its path.
  Each replay's caches evolve from its own choices, so a request's state is close, not identical.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import time

import numpy as np

from client_sdk import KVLayout, ObjectCacheClient, chunk_keys

from . import upstreams
from .cluster_sim_models import SAMPLE_TRACE, load_records
from .harness import BenchServer, s3_client, start_server

MODES = ("scheduler", "peer-first", "upstream")
NODES = ("a", "b", "c")
# Quiet time before each kv-get. The nine nodes stand for nine hosts, but share two cores here: a node lands a fetched
# prefix in its cache after its kv-get, and that landing slowed the next trio's kv-get (the upstream-only replay's 24-chunk
# fetches took 85-180 ms back to back). The peer case pauses so too (``bench.cluster.SETTLE_S``).
SETTLE_S = 0.5
WARMUP = 3  # requests whose prediction errors are left out: the nodes learn their fixed costs from them


def node_toml(name: str, port: int, key: str, mode: str, peer_rate: float, first_byte_ms: float, cache_bytes: int,
              store_streams: int = 0) -> str:
    return (f"[cache]\nmax_bytes = {cache_bytes}\nfetch_concurrency = 4\n"
            f'[cluster]\nnode_id = "{name}"\nlisten = "127.0.0.1:{port}"\nkey = "{key}"\n'
            f'registry_bucket = "oc-bench-oracle-{mode}"\nheartbeat_s = 1.0\nmissed_heartbeats = 5\nlookup_timeout_s = 1.0\n'
            f'peer_timeout_s = 10.0\nfetch_concurrency = 4\nzone = "z1"\nrack = "r-{name}"\npath_choice = "{mode}"\n'
            f"cold_split_peers = 1\nserve_max_bytes_per_s = {peer_rate}\nsame_zone_gbps = {peer_rate * 8 / 1e9}\n"
            f"upstream_first_byte_ms = {first_byte_ms}\nupstream_store_streams = {store_streams}\nestimate_refresh_s = 0.5\n")


def trace_requests(n: int, max_chunks: int, reuse: float = 0.6) -> list[list[int]]:
    """``n`` requests as chunk (block id) lists: the bundled sample's lengths (at most ``max_chunks``), each request
    with probability ``reuse`` a later turn of an earlier one (its whole prefix, then a few new blocks), as the cluster
    simulator's chatbot profile reuses prefixes (the raw sample shares none)."""
    rng = np.random.default_rng(7)
    lengths = [min(len(r["hash_ids"]), max_chunks) for r in load_records(SAMPLE_TRACE)]
    out: list[list[int]] = []
    fresh = 10**6
    for i in range(n):
        if out and rng.random() < reuse:
            base = out[int(rng.integers(len(out)))]
            grow = int(rng.integers(1, 4))
            out.append((base + list(range(fresh, fresh + grow)))[:max_chunks])
            fresh += grow
        else:
            size = max(1, lengths[i % len(lengths)])
            out.append(list(range(fresh, fresh + size)))
            fresh += size
    return out


def keys_of(blocks: list[int], layout: KVLayout) -> list[str]:
    g = layout.chunk_tokens
    tokens = np.concatenate([np.arange(g, dtype=np.uint64) + np.uint64(h * g) for h in blocks])
    return chunk_keys(tokens, g, "bench-oracle")


async def upload(node: BenchServer, bucket: str, keys: list[str], blob: bytes) -> None:
    """Every chunk into the upstream only (plain S3 PUTs through A keep no cache copy)."""
    async with s3_client(node.endpoint, node.access_key, node.secret_key) as s3:
        await s3.create_bucket(Bucket=bucket)
        gate = asyncio.Semaphore(8)

        async def one(k: str) -> None:
            async with gate:
                await s3.put_object(Bucket=bucket, Key=k, Body=blob)

        await asyncio.gather(*(one(k) for k in keys))


async def calibrate(up: upstreams.Upstream, blob: bytes) -> tuple[float, int]:
    """The upstream as an operator would measure it with an S3 client: the median time of one GET of a chunk (ms), and
    how many GETs it serves at once (8 at once against one at a time, rounded)."""
    bucket, key = "oc-bench-oracle-calibration", "probe"
    async with s3_client(up.endpoint, up.access_key, up.secret_key) as s3:
        await s3.create_bucket(Bucket=bucket)
        await s3.put_object(Bucket=bucket, Key=key, Body=blob)

        async def get() -> float:
            t0 = time.perf_counter()
            resp = await s3.get_object(Bucket=bucket, Key=key)
            await resp["Body"].read()
            return time.perf_counter() - t0

        one = statistics.median([await get() for _ in range(7)])
        rounds = []
        for _ in range(3):
            t0 = time.perf_counter()
            await asyncio.gather(*(get() for _ in range(8)))
            rounds.append(time.perf_counter() - t0)
    return one * 1e3, max(1, round(8 * one / statistics.median(rounds)))


async def start_trio(up: upstreams.Upstream, mode: str, cache: int, peer_rate: float, fb_ms: float, store_streams: int,
                     creds: tuple[str, str] | None) -> dict[str, BenchServer]:
    key = secrets.token_urlsafe(33)
    nodes: dict[str, BenchServer] = {}
    try:
        for name in NODES:
            # Port 0: the peer listener binds any free port and the heartbeat record tells the others (a port picked
            # beforehand can be taken meanwhile by the node's own RPC listener).
            toml = node_toml(name, 0, key, mode, peer_rate, fb_ms, cache, store_streams)
            nodes[name] = start_server(toml, credentials=creds, store_toml=up.store_toml())
            creds = creds or (nodes[name].access_key, nodes[name].secret_key)
        wait_all_live(nodes)
    except BaseException:
        for n in nodes.values():
            n.stop()
        raise
    return nodes


async def one_request(nodes: dict[str, BenchServer], bucket: str, name: str, keys: list[str], layout: KVLayout, transport: str) -> dict:
    node = nodes[name]
    async with ObjectCacheClient(node.endpoint, node.access_key, node.secret_key, bucket=bucket) as c:
        est = (await c.estimate(keys, [name], layout)).candidates[0]
        t0 = time.perf_counter()
        _, stats = await c.fetch(keys, layout, transport, mode="layerwise", verify=True)
        wall = time.perf_counter() - t0
    s = stats.server
    # The kv-get's own prediction, made on the path its pin took (the node's latest, from its status): the model's
    # parts (the pin's fetch, its critical source) beside the measured, for the README's reasons.
    recent = node.status().get("oracle", {}).get("recent") or [None]
    return {"node": name, "chunks": len(keys), "s": wall, "measured_first_layer_s": s.setup_s + s.first_layer_s,
            "predicted_first_layer_s": est.first_layer_s, "predicted_total_s": est.total_s,
            "setup_s": s.setup_s, "server_first_layer_s": s.first_layer_s, "server_total_s": s.total_s,
            "predicted_path": [p.source for p in est.path], "predicted_plan": [[p.source, p.first_chunk, p.end_chunk] for p in est.path],
            "predicted_links": {k.name: round(k.bandwidth_bytes_per_s) for k in est.links}, "kv_get_forecast": recent[-1],
            "request_id": s.request_id, "paths": s.paths}


async def replay(up: upstreams.Upstream, layout: KVLayout, requests: list[list[int]], blob: bytes,
                 peer_rate: float, fb_ms: float, store_streams: int, transport: str,
                 settle_s: float = 0.0) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    """The replay under every path choice at once, request by request (request i under each mode, then i + 1), so the
    modes see the same moment of a shared machine's load; each mode has its own three nodes and bucket."""
    cache = 4 * layout.chunk_bytes * sum(len(r) for r in requests)
    trios: dict[str, dict[str, BenchServer]] = {}
    try:
        creds = None
        for mode in MODES:
            trios[mode] = await start_trio(up, mode, cache, peer_rate, fb_ms, store_streams, creds)
            creds = creds or (trios[mode]["a"].access_key, trios[mode]["a"].secret_key)
        all_keys = sorted({k for r in requests for k in keys_of(r, layout)})
        for mode, nodes in trios.items():
            await upload(nodes["a"], f"oracle-{mode}", all_keys, blob)
        rows: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for i, blocks in enumerate(requests):
            keys = keys_of(blocks, layout)
            for k in range(len(MODES)):  # the order rotates, so no mode is always first after a pause
                mode = MODES[(i + k) % len(MODES)]
                await asyncio.sleep(settle_s)
                rows[mode].append(await one_request(trios[mode], f"oracle-{mode}", NODES[i % len(NODES)], keys, layout, transport))
        # What the scheduler's nodes learnt (measured rates, fixed costs): the README's reasons come from here.
        learnt = {name: node.status().get("oracle", {}) for name, node in trios["scheduler"].items()}
        return rows, learnt
    finally:
        for nodes in trios.values():
            for n in nodes.values():
                n.stop()


def wait_all_live(nodes: dict[str, BenchServer]) -> None:
    deadline = time.monotonic() + 30
    for name, node in nodes.items():
        while not set(nodes) - {name} <= set(node.status()["cluster"]["live_peers"]):
            if time.monotonic() > deadline:
                raise RuntimeError("cluster nodes not live within 30 s")
            time.sleep(0.1)


async def run_case(up: upstreams.Upstream, args: argparse.Namespace, layout: KVLayout) -> dict:
    """The oracle case on ``up``: three replays side by side and the two headline fields."""
    n = 6 if args.quick else args.oracle_requests
    requests = trace_requests(n, 4 if args.quick else 24)
    blob = np.random.default_rng(5).integers(0, 256, layout.chunk_bytes, dtype=np.uint8).tobytes()
    peer_rate = args.peer_mbps * 1e6
    fb_ms, store_streams = await calibrate(up, blob)
    runs, learnt = await replay(up, layout, requests, blob, peer_rate, fb_ms, store_streams, args.transport,
                                0.0 if args.quick else args.oracle_settle_s)
    sched = runs["scheduler"]
    errors = [abs(r["predicted_first_layer_s"] - r["measured_first_layer_s"]) / r["measured_first_layer_s"]
              for r in sched[WARMUP:] if r["measured_first_layer_s"] > 0]
    regrets = [path_regret([runs[m][i] for m in MODES]) for i in range(len(sched))]
    samples = [sched[i]["s"] / min(runs[m][i]["s"] for m in MODES) - 1 for i in range(len(sched))]
    return {"requests": len(requests), "settle_s": 0.0 if args.quick else args.oracle_settle_s, "peer_bytes_per_s": peer_rate, "upstream_first_byte_ms": fb_ms, "upstream_store_streams": store_streams,
            "oracle_first_layer_error_p50": statistics.median(errors) if errors else None,
            "path_regret_p50": statistics.median(regrets), "sample_regret_p50": statistics.median(samples),
            "choice_regret_p50": _median_or_none([r for i, r in enumerate(regrets) if len({path_of(runs[m][i]) for m in MODES}) > 1]),
            "modes": {m: {"mean_s": statistics.mean(r["s"] for r in rs), "p50_s": statistics.median(r["s"] for r in rs),
                          "chunk_paths": _path_totals(rs)} for m, rs in runs.items()},
            "runs": runs, "learnt": learnt}


def path_of(row: dict) -> tuple[str, ...]:
    """The path a kv-get took: the kinds of source its chunks came from (``local``, ``peer``, ``upstream``)."""
    return tuple(sorted({"peer" if p.startswith("peer:") else p for p, b in row["paths"].items() if b > 0}))


def path_regret(rows: list[dict]) -> float:
    """One request under each path choice, ``rows[0]`` the scheduler's: its path's time over the best path's, minus one.
    A path's time is the mean of the replays that took it: replays that took the same path are samples of one path,
    and charging the scheduler for the slower of two samples of the path it chose measures the machine's noise, not
    the choice (the best of three noisy samples is below each one's typical time even when all three agree)."""
    times: dict[tuple[str, ...], list[float]] = {}
    for r in rows:
        times.setdefault(path_of(r), []).append(r["s"])
    mean = {p: statistics.mean(ts) for p, ts in times.items()}
    return mean[path_of(rows[0])] / min(mean.values()) - 1


def _median_or_none(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _path_totals(rows: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        for p, b in r["paths"].items():
            p = "peer" if p.startswith("peer:") else p
            out[p] = out.get(p, 0) + b
    return out


def report(case: dict) -> None:
    print(f"\noracle case: {case['requests']} trace requests over A, B, C (peer links paced to {case['peer_bytes_per_s'] / 1e6:.0f} MB/s, "
          f"upstream first byte {case['upstream_first_byte_ms']:.1f} ms, {case['upstream_store_streams']} GET(s) at once)")
    for m, v in case["modes"].items():
        print(f"  path_choice={m:10s} mean {v['mean_s'] * 1e3:7.1f} ms  p50 {v['p50_s'] * 1e3:7.1f} ms  bytes by path {v['chunk_paths']}")
    err = case["oracle_first_layer_error_p50"]
    choice = case.get("choice_regret_p50")
    print(f"  oracle first-layer error p50: {'n/a' if err is None else f'{err:.0%}'} (goal ≤ 20%); "
          f"path regret p50: {case['path_regret_p50']:+.0%} (goal ≤ 10%); over requests whose replays took different paths: "
          f"{'n/a' if choice is None else f'{choice:+.0%}'}; per sample (best of three replays' times): {case['sample_regret_p50']:+.0%}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--oracle-requests", type=int, default=24, help="trace requests the oracle case replays")
    p.add_argument("--oracle-settle-s", type=float, default=SETTLE_S,
                   help="quiet seconds before each kv-get of the oracle case (0: back to back)")
    p.add_argument("--peer-mbps", type=float, default=16.0, help="each node's pace to its peers in the oracle case (MB/s)")
