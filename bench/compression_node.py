"""TTFT vs link rate through a real node: raw chunks vs chunks stored compressed, decoded in the node, in the
SDK, or where ``decode="auto"`` (the kv-get path's own choice, :mod:`storage_server.decode_choice`) puts it.

Per link rate, one ``objectcache serve`` whose bandwidth pool is that rate (``[bandwidth] capacity_gbps``,
``burst_layers = 0``): every layerwise kv-get is paced to it, charged the bytes its link carries. The same KV
is put twice, raw and with the stored codec; each http kv-get (the storage server's data endpoint) is timed
by the SDK, layer by layer, and the engine's compute is laid over the layer arrival times as in the model
sweep. Before the timed runs one kv-get decodes in the node and one in the SDK, so both sides have measured
decode rates (what ``auto`` decides with). Runs interleave (repeat → variant); median of ``repeats``.

Those nodes run with ``compression.decoded_copies_bytes = 0``, so every kv-get the node serves decodes (what the
"node" column measures). At the slowest and the fastest rate a node with the default configuration (decoded copies on,
the default budget) runs raw and ``auto`` again (:func:`_default_at_rate`): ``first`` is a kv-get of chunks no kv-get
read before, after their kv-put landed (``compression.decode_on_put``: the node copied them right after the put, so on
a fast link it reads copies), ``put_then_get`` one issued the moment its kv-put returns (racing those copies: what it
finds not copied yet the node decodes, or the SDK does), ``auto`` a warm kv-get of chunks read once before (on a fast
link: served from the copies, gathered like raw chunks). The headline fields come from these.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import numpy as np

from client_sdk import KVLayout, ObjectCacheClient, chunk_keys

from .compression_kv import KVSample
from .compute_model import modelled_ttft
from .harness import start_server

BUCKET = "compression-node"
VARIANTS = ("raw", "node", "client", "auto")


def _layout(sample: KVSample, layers: int) -> KVLayout:
    return KVLayout(layers, sample.layout.tokens, 1, sample.layout.channels, "bfloat16")


def _chunks(sample: KVSample, layout: KVLayout, n: int) -> list[np.ndarray]:
    k = len(sample.slices)
    return [np.concatenate([sample.slices[(c * layout.num_layers + layer) % k] for layer in range(layout.num_layers)]) for c in range(n)]


async def _at_rate(server, sample: KVSample, codec: str, layers: int, chunks: int, repeats: int, workers: int,
                   compute_per_layer: float, variants: tuple[str, ...] = VARIANTS) -> dict:
    layout = _layout(sample, layers)
    data = _chunks(sample, layout, chunks)
    tokens = np.arange(chunks * layout.chunk_tokens, dtype=np.uint64)
    raw_keys, packed_keys = chunk_keys(tokens, layout.chunk_tokens, "node-raw"), chunk_keys(tokens, layout.chunk_tokens, "node-packed")
    async with ObjectCacheClient(server.endpoint, server.access_key, server.secret_key, bucket=BUCKET, decode_threads=workers) as c:
        await c.ensure_bucket()
        await c.put_chunks(raw_keys, data, layout)
        await c.put_chunks(packed_keys, data, layout, codec=codec)
        want = np.stack(data).reshape(chunks, layers, -1).transpose(1, 0, 2).reshape(layers, -1)

        async def get(variant: str) -> dict:
            keys = raw_keys if variant == "raw" else packed_keys
            decode = "node" if variant == "raw" else variant
            t0 = time.perf_counter()
            payload, stats = await c.fetch(keys, layout, "http", mode="layerwise", verify=False, decode=decode)
            total = time.perf_counter() - t0
            site = stats.server.decode_site
            copies = int(site.get("decoded_copies", 0))
            return {"decoded_copies": copies, "ttft_s": modelled_ttft(stats.layer_arrival_s, compute_per_layer), "load_s": total,
                    "site": site.get("site", "-"), "reason": site.get("reason", ""),
                    "wire_bytes": int(site.get("wire_bytes", layout.payload_bytes(chunks))),
                    "exact": bool(np.array_equal(payload, want)) if variant == "raw" or codec == "zstd" else None}

        await get("node")  # both sides' decoders measured before auto decides with them
        await get("client")
        await _copies_filled(server)
        runs: dict[str, list[dict]] = {v: [] for v in variants}
        for r in range(repeats):
            for v in variants[r % len(variants):] + variants[:r % len(variants)]:
                runs[v].append(await get(v))
    out = {}
    for v in variants:
        ttfts = [x["ttft_s"] for x in runs[v]]
        mid = runs[v][ttfts.index(statistics.median_low(ttfts))]
        out[v] = {"ttft_s": round(mid["ttft_s"], 6), "runs_ttft_s": [round(t, 6) for t in ttfts], "load_s": round(mid["load_s"], 6),
                  "wire_bytes": mid["wire_bytes"], "site": mid["site"], "sites": sorted({x["site"] for x in runs[v]}),
                  "reason": mid["reason"], "decoded_copies": mid["decoded_copies"], "byte_exact": None if mid["exact"] is None else all(x["exact"] for x in runs[v])}
    return out


async def _default_at_rate(server, sample: KVSample, codec: str, layers: int, chunks: int, repeats: int, workers: int,
                           compute_per_layer: float) -> dict:
    """A node with the default configuration: raw (warm), ``first`` (auto over chunks never read before, a fresh set
    per repeat, put before the runs), ``put_then_get`` (auto the moment a fresh set's kv-put returns) and ``auto``
    (warm: the first repeat's chunks again, its copies filled)."""
    layout = _layout(sample, layers)
    data = _chunks(sample, layout, chunks)
    tokens = np.arange(chunks * layout.chunk_tokens, dtype=np.uint64)

    def keys(ns: str) -> list[str]:
        return chunk_keys(tokens, layout.chunk_tokens, ns)
    want = np.stack(data).reshape(chunks, layers, -1).transpose(1, 0, 2).reshape(layers, -1)
    async with ObjectCacheClient(server.endpoint, server.access_key, server.secret_key, bucket=BUCKET, decode_threads=workers) as c:
        await c.ensure_bucket()
        await c.put_chunks(keys("default-raw"), data, layout)
        for ns in ["default-warmup", *(f"default-first-{r}" for r in range(repeats))]:
            await c.put_chunks(keys(ns), data, layout, codec=codec)

        async def get(ns: str, decode: str) -> dict:
            payload, stats = await c.fetch(keys(ns), layout, "http", mode="layerwise", verify=False, decode=decode)
            site = stats.server.decode_site
            return {"ttft_s": modelled_ttft(stats.layer_arrival_s, compute_per_layer), "site": site.get("site", "-"),
                    "decoded_copies": int(site.get("decoded_copies", 0)), "read": site.get("decoded_copies_read", "-"),
                    "exact": bool(np.array_equal(payload, want)) if ns == "default-raw" or codec == "zstd" else None}

        await get("default-warmup", "node")  # both sides' decoders measured (on other chunks) before auto decides
        await get("default-warmup", "client")
        await _copies_filled(server)
        runs: dict[str, list[dict]] = {"raw": [], "first": [], "put_then_get": [], "auto": []}
        for r in range(repeats):  # a kv-get of chunks never read before; its copies filled before the next kv-get
            runs["first"].append(await get(f"default-first-{r}", "auto"))
            await _copies_filled(server)
            await c.put_chunks(keys(f"default-race-{r}"), data, layout, codec=codec)
            runs["put_then_get"].append(await get(f"default-race-{r}", "auto"))  # at once: racing the copies of its put
            await _copies_filled(server)
        for r in range(2 * repeats):  # raw and warm auto (the first repeat's chunks again) interleaved, either first in turn
            for v in (("raw", "auto") if r % 2 == 0 else ("auto", "raw")):
                runs[v].append(await get("default-raw", "node") if v == "raw" else await get("default-first-0", "auto"))
        budget = server.status().get("decoded_copies", {}).get("max_bytes", 0)
    out: dict = {"decoded_copies_bytes": budget}
    for v, got in runs.items():
        ttfts = [x["ttft_s"] for x in got]
        mid = got[ttfts.index(statistics.median_low(ttfts))]
        out[v] = {"ttft_s": round(mid["ttft_s"], 6), "runs_ttft_s": [round(t, 6) for t in ttfts], "site": mid["site"],
                  "sites": sorted({x["site"] for x in got}), "decoded_copies": mid["decoded_copies"], "decoded_copies_read": mid["read"],
                  "runs_copies": [x["decoded_copies"] for x in got],
                  "byte_exact": None if mid["exact"] is None else all(x["exact"] for x in got)}
    return out


async def _copies_filled(server) -> None:
    """Until the node's decoded copies (if any) have no fill queued (bounded): the timed runs then read them."""
    deadline = time.monotonic() + 60
    while server.status().get("decoded_copies", {}).get("pending") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def measure(sample: KVSample, codec: str, rates: list[float], layers: int, payload_mb: int, repeats: int, workers: int,
            compute_per_layer: float) -> dict:
    """One node per rate; rows of raw / node / client / auto TTFT (the auto row is the real kv-get path's choice)."""
    layout = _layout(sample, layers)
    chunks = max(1, (payload_mb << 20) // layout.chunk_bytes)

    def config(rate: float, copies_bytes: int | None = 0) -> str:  # None: the default budget
        copies = "" if copies_bytes is None else f"decoded_copies_bytes = {copies_bytes}\n"
        return (f'[compression]\nlossy_buckets = ["{BUCKET}"]\ndecompress_threads = {workers}\ndequantise_threads = {workers}\n'
                f'{copies}[bandwidth]\npolicy = "equal"\nburst_layers = 0\ncapacity_gbps = {rate!r}\n')

    rows = []
    for rate in rates:
        server = start_server(config(rate))
        try:
            got = asyncio.run(_at_rate(server, sample, codec, layers, chunks, repeats, workers, compute_per_layer))
        finally:
            server.stop()
        raw = got["raw"]["ttft_s"]
        rows.append({"link_gbps": rate, "variants": got, **{f"{v}_vs_raw": round(raw / got[v]["ttft_s"], 4) for v in VARIANTS if v != "raw"}})
    default = []
    for rate in sorted({rates[0], rates[-1]}):
        server = start_server(config(rate, None))
        try:
            got = asyncio.run(_default_at_rate(server, sample, codec, layers, chunks, repeats, workers, compute_per_layer))
        finally:
            server.stop()
        raw = got["raw"]["ttft_s"]
        default.append({"link_gbps": rate, "decoded_copies_bytes": got.pop("decoded_copies_bytes"), "variants": got,
                        "first_vs_raw": round(raw / got["first"]["ttft_s"], 4), "auto_vs_raw": round(raw / got["auto"]["ttft_s"], 4),
                        "put_then_get_vs_raw": round(raw / got["put_then_get"]["ttft_s"], 4)})
    return {"measured": True, "codec": codec, "kv": sample.name, "chunks": chunks, "layers": layers, "payload_bytes": layout.payload_bytes(chunks),
            "workers": workers, "transport": "http (data endpoint)", "rows": rows, "default_config": default,
            "method": "measured: a node's paced kv-gets, layer arrival times at the SDK; modelled: the engine's compute laid over them"}
