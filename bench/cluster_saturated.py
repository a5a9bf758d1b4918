"""``bench cluster`` case (a): node A's link capped and saturated by a background tenant while B is idle and warm.

DualPath's situation on loopback: node A's delivery to its engines is capped (its bandwidth pool,
``bandwidth.capacity_gbps``: a cap every kv-get A delivers shares) and kept busy by a background
tenant fetching its own prefix through A in a loop (another engine: a process of its own,
:mod:`.cluster_background`); the measured tenant's prefixes are warm on
peer B (idle, uncapped) and cold on A. Two A nodes over the same upstream, identical but for
``cluster.direct_from_peers``:

* **without the second path** — A fetches the chunks from B's cache and delivers them over its
  saturated link;
* **with the second path** — B delivers them straight to the engine (rdma: B writes into the
  engine's registered memory; http: the client streams from B's data endpoint on a ticket A
  obtained), and A's link carries none of it.

Reported per variant: TTFT (layer 0 handed to the engine) and throughput (payload over the
kv-get's time) of the measured tenant's kv-gets, best of ``repeats`` fresh prefixes each;
``saturated_speedup`` = kv-get time without / with.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys
import time
from pathlib import Path

import numpy as np

from client_sdk import KVLayout, ObjectCacheClient, chunk_keys

from . import upstreams
from .harness import BenchServer, start_server

BACKGROUND_STREAMS = 2  # concurrent background kv-gets keeping A's link saturated (another engine: its own process)
BACKGROUND_START_S = 180.0  # its start (imports, clients, a first kv-get each) or stop on a loaded machine, at most
BG_KEY, BG_SECRET = "BENCHBACKGROUND", "background-tenant-secret-key-0123"


def _toml(name: str, key: str, cache_bytes: int, cap_gbps: float, direct: bool) -> str:
    return (f"[cache]\nmax_bytes = {cache_bytes}\nfetch_concurrency = 16\n"
            '[storage_server]\ndata_listen = "127.0.0.1:0"\n'
            + (f"[bandwidth]\ncapacity_gbps = {cap_gbps}\nmargin_gbps = 0\n" if cap_gbps else "")
            + f'[cluster]\nnode_id = "{name}"\nlisten = "127.0.0.1:{upstreams._free_port()}"\nkey = "{key}"\n'
            'registry_bucket = "oc-bench-saturated"\nheartbeat_s = 1.0\nmissed_heartbeats = 30\nlookup_timeout_s = 1.0\n'
            # The upstream is remote storage in this case (DualPath's setting): far enough that B's cache is the path
            # both variants take, so what differs is only the route B's bytes travel, never which copy is read.
            'upstream_first_byte_ms = 1000\n'
            f"peer_timeout_s = 5.0\ndirect_from_peers = {'true' if direct else 'false'}\n"
            f'[[tenants]]\nname = "background"\naccess_key = "{BG_KEY}"\nsecret_key = "{BG_SECRET}"\n')


def pick_transport() -> str:
    """rdma where this process has NIXL (the peer writes into the engine's memory), else http (the peer's data endpoint)."""
    from client_sdk.rdma import rdma_available

    return "rdma" if rdma_available()[0] else "http"


async def _fetch(c: ObjectCacheClient, keys: list[str], layout: KVLayout, transport: str):
    t0 = time.perf_counter()
    _, stats = await c.fetch(keys, layout, transport, mode="layerwise", verify=True)
    return time.perf_counter() - t0, stats


async def _put(node: BenchServer, creds: tuple[str, str], bucket: str, keys: list[str], layout: KVLayout, blob: np.ndarray) -> None:
    async with ObjectCacheClient(node.endpoint, *creds, bucket=bucket) as c:
        await c.ensure_bucket()
        await c.put_chunks(keys, [blob] * len(keys), layout)


async def _background(node: BenchServer, keys: list[str], layout: KVLayout, transport: str) -> asyncio.subprocess.Process:
    """The background tenant's kv-gets through ``node`` in a process of its own (:mod:`.cluster_background`), started
    and returned once each of its streams completed one; closing its standard input stops it."""
    spec = {"endpoint": node.endpoint, "access_key": BG_KEY, "secret_key": BG_SECRET, "bucket": "bench-background", "keys": keys,
            "transport": transport, "streams": BACKGROUND_STREAMS,
            "layout": {f: getattr(layout, f) for f in ("num_layers", "chunk_tokens", "kv_heads", "head_dim", "dtype")}}
    repo = str(Path(__file__).resolve().parent.parent)
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p)}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "bench.cluster_background", json.dumps(spec), cwd=repo, env=env,
                                                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None

    async def ready() -> bool:  # other lines (NIXL's log on its standard output) are skipped
        while line := await proc.stdout.readline():
            if line.strip() == b"ready":
                return True
        return False

    try:
        started = await asyncio.wait_for(ready(), BACKGROUND_START_S)
    except asyncio.TimeoutError:
        started = False
    if not started:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"the background tenant did not start within {BACKGROUND_START_S:g} s (exit status {proc.returncode})")
    return proc


async def _stop_background(proc: asyncio.subprocess.Process) -> int:
    """Stop the background tenant; how many kv-gets it completed."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    try:
        out = await asyncio.wait_for(proc.stdout.read(), BACKGROUND_START_S)
        await asyncio.wait_for(proc.wait(), BACKGROUND_START_S)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError("the background tenant did not stop") from None
    counts = [line.strip() for line in out.decode(errors="replace").splitlines() if line.strip().isdigit()]
    return int(counts[-1]) if counts else 0


async def _variant(a: BenchServer, b: BenchServer, label: str, layout: KVLayout, context: int, repeats: int, transport: str,
                   rng: np.random.Generator) -> dict:
    creds = (a.access_key, a.secret_key)
    n = context // layout.chunk_tokens
    blob = rng.integers(0, 256, layout.chunk_bytes, dtype=np.uint8)
    bg_keys = chunk_keys(np.arange(context, dtype=np.uint64) + 3 * 10**9, layout.chunk_tokens, f"background-{label}")
    await _put(a, (BG_KEY, BG_SECRET), "bench-background", bg_keys, layout, blob)  # warm on A: it loads A's link only
    warm = chunk_keys(np.arange(layout.chunk_tokens, dtype=np.uint64) + 35 * 10**8, layout.chunk_tokens, f"warmup-{label}")
    await _put(b, creds, "bench-saturated", warm, layout, blob)
    # The measured tenant is one engine: one client (its registered memory reused) for all its kv-gets.
    engine = ObjectCacheClient(a.endpoint, *creds, bucket="bench-saturated")
    await engine.__aenter__()
    await _fetch(engine, warm, layout, transport)  # first-request costs (registration, agents, connections) out of the timings
    background = await _background(a, bg_keys, layout, transport)  # it has the link once each stream completed a kv-get
    runs = []
    try:
        for r in range(repeats):
            keys = chunk_keys(np.arange(context, dtype=np.uint64) + (20 + r) * 10**8, layout.chunk_tokens, f"saturated-{label}-{r}")
            await _put(b, creds, "bench-saturated", keys, layout, blob)  # warm on B, cold on A
            seconds, stats = await _fetch(engine, keys, layout, transport)
            runs.append({"s": seconds, "ttft_s": stats.first_layer_s, "paths": stats.server.paths, "direct": stats.direct,
                         "server_setup_s": stats.server.setup_s, "server_first_layer_s": stats.server.first_layer_s,
                         "server_total_s": stats.server.total_s})
    finally:
        completed = await _stop_background(background)
        await engine.__aexit__(None, None, None)
    best = min(runs, key=lambda x: x["s"])
    payload = layout.payload_bytes(n)
    return {"s": best["s"], "ttft_s": best["ttft_s"], "server": {k: best[k] for k in ("server_setup_s", "server_first_layer_s", "server_total_s")}, "gb_per_s": payload / best["s"] / 1e9, "paths": best["paths"],
            "runs_s": [x["s"] for x in runs], "background_kv_gets": completed}


async def saturated(up: upstreams.Upstream, layout: KVLayout, context: int, repeats: int) -> dict:
    """Case (a) over upstream ``up``: A's link capped so one prefix alone takes ~0.25 s, saturated by the background."""
    payload = layout.payload_bytes(context // layout.chunk_tokens)
    cap_gbps = payload * 8 / 0.25 / 1e9
    cache = 8 * payload * (repeats + 2)
    key = secrets.token_urlsafe(33)
    transport = pick_transport()
    nodes: dict[str, BenchServer] = {}
    try:
        nodes["b"] = start_server(_toml("sb", key, cache, 0, False), store_toml=up.store_toml())
        creds = (nodes["b"].access_key, nodes["b"].secret_key)
        for name, direct in (("a_with", True), ("a_without", False)):
            nodes[name] = start_server(_toml(name.replace("_", "-"), key, cache, cap_gbps, direct), credentials=creds,
                                       store_toml=up.store_toml())
        for name in ("a_with", "a_without"):
            _wait_live(nodes[name], {"sb"})
        rng = np.random.default_rng(5)
        without = await _variant(nodes["a_without"], nodes["b"], "without", layout, context, repeats, transport, rng)
        with_ = await _variant(nodes["a_with"], nodes["b"], "with", layout, context, repeats, transport, rng)
        return {"transport": transport, "cap_gbps": cap_gbps, "background_streams": BACKGROUND_STREAMS, "payload_bytes": payload,
                "without_second_path": without, "with_second_path": with_, "speedup": without["s"] / with_["s"],
                "ttft_speedup": (without["ttft_s"] or 0) / (with_["ttft_s"] or 1)}
    finally:
        for node in nodes.values():
            node.stop()


def _wait_live(node: BenchServer, peers: set[str]) -> None:
    deadline = time.monotonic() + 30
    while not peers <= set(node.status()["cluster"]["live_peers"]):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{sorted(peers)} not live within 30 s")
        time.sleep(0.1)


def report_lines(result: dict) -> list[str]:
    """The case's lines under the bench table, per upstream."""
    lines = []
    for name, r in result["upstreams"].items():
        s = r.get("saturated")
        if not s:
            continue
        w, o = s["with_second_path"], s["without_second_path"]
        lines.append(f"{name}: A's link capped at {s['cap_gbps']:.2f} Gbit/s and saturated ({s['background_streams']} background "
                     f"kv-gets), {s['transport']}: without the second path {o['s'] * 1e3:.0f} ms (TTFT {o['ttft_s'] * 1e3:.0f} ms, "
                     f"{o['gb_per_s']:.3f} GB/s), with {w['s'] * 1e3:.0f} ms (TTFT {w['ttft_s'] * 1e3:.0f} ms, {w['gb_per_s']:.3f} GB/s): "
                     f"{s['speedup']:.2f}× (TTFT {s['ttft_speedup']:.2f}×)")
    return lines
