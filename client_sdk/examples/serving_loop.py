"""Runnable example: a prefill loop that computes layer ℓ while layer ℓ+1 is still loading.

    source data/dev-credentials.env       # keys + endpoint written by `objectcache serve`
    .venv/bin/python -m client_sdk.examples.serving_loop --context 2048 --hit 0.875

It stores the prompt's cached prefix as chunk objects (first run), looks up
the longest cached prefix, then runs prefill two ways and prints both TTFTs:
load-then-compute, and layer-by-layer overlap through the engine adapter.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from client_sdk import KVLayout, chunk_keys
from client_sdk.engine import ObjectCacheKVConnector
from client_sdk.sync import SyncObjectCacheClient


def compute_layer(kv: np.ndarray, miss_tokens: int, budget_s: float) -> float:
    """Stand-in for one transformer layer over the miss tokens: attention-shaped numpy math, padded to ``budget_s``.

    Like a GPU kernel, it releases the GIL while it runs (numpy's matmul, then ``time.sleep``
    for the rest of the budget), so the client's I/O thread keeps loading the next layers
    meanwhile. A Python busy loop here would hold the GIL and hide the very overlap shown.
    """
    start = time.perf_counter()
    keys = kv[:, 0].reshape(-1, kv.shape[-1]).astype(np.float32)[:4096]
    q = np.ones((min(miss_tokens, 256), keys.shape[-1]), np.float32)
    (q @ keys.T).max()
    time.sleep(max(0.0, budget_s - (time.perf_counter() - start)))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoint", default=os.environ.get("AWS_ENDPOINT_URL", "http://127.0.0.1:9000"))
    p.add_argument("--bucket", default="kv-example")
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--chunk-tokens", type=int, default=16)
    p.add_argument("--context", type=int, default=2048, help="prompt length in tokens")
    p.add_argument("--hit", type=float, default=0.875, help="fraction of the prompt that is a cached prefix")
    p.add_argument("--layer-compute-ms", type=float, default=2.0, help="compute time per layer for the miss tokens")
    p.add_argument("--transport", default="auto", choices=["auto", "shm", "http"])
    args = p.parse_args(argv)

    layout = KVLayout.preset(args.model, chunk_tokens=args.chunk_tokens)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 128_000, size=args.context)
    cached_tokens = int(args.context * args.hit) // layout.chunk_tokens * layout.chunk_tokens
    keys = chunk_keys(prompt[:cached_tokens], layout.chunk_tokens, args.model)
    budget = args.layer_compute_ms / 1000

    with SyncObjectCacheClient(args.endpoint, os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"], args.bucket) as client:
        client.ensure_bucket()
        if client.lookup(keys) < len(keys):
            chunks = rng.integers(0, 256, size=(len(keys), layout.chunk_bytes), dtype=np.uint8)
            client.put_chunks(keys, list(chunks), layout)
            print(f"stored {len(keys)} chunk objects ({len(keys) * layout.chunk_bytes / 2**20:.1f} MiB)")
        hit = client.lookup(keys)
        miss = args.context - hit * layout.chunk_tokens
        print(f"prompt {args.context} tokens: {hit} chunks ({hit * layout.chunk_tokens} tokens) cached, {miss} to compute")

        # Load everything, then compute.
        t0 = time.perf_counter()
        payload, _ = client.fetch(keys[:hit], layout, args.transport)
        per_layer = payload.reshape(layout.num_layers, hit, 2, layout.chunk_tokens, layout.kv_heads, layout.head_dim * layout.dtype_bytes)
        for layer in range(layout.num_layers):
            compute_layer(per_layer[layer], miss, budget)
        sequential = time.perf_counter() - t0

        # Overlap: layer ℓ computes while ℓ+1 loads.
        connector = ObjectCacheKVConnector(client, layout, args.transport)
        t0 = time.perf_counter()
        connector.start_load_kv(keys[:hit], compute_window=budget)
        for layer in range(layout.num_layers):
            kv = connector.wait_for_layer_load(layer)
            compute_layer(kv, miss, budget)
        overlapped = time.perf_counter() - t0
        connector.wait_for_load()

    compute_only = layout.num_layers * budget
    print(f"TTFT load-then-compute: {sequential * 1000:.1f} ms")
    print(f"TTFT layer-overlapped:  {overlapped * 1000:.1f} ms (compute alone: {compute_only * 1000:.1f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
