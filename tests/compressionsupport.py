"""Helpers for compressed-chunk tests: a small bf16 KV layout and KV-like chunks of it."""

from __future__ import annotations

import numpy as np

from client_sdk import KVLayout
from protocol.codecs.base import from_float32


def kv_layout(chunk_tokens: int) -> KVLayout:
    return KVLayout(num_layers=4, chunk_tokens=chunk_tokens, kv_heads=2, head_dim=8, dtype="bfloat16")


def kv_chunks(layout: KVLayout, n: int, seed: int) -> list[np.ndarray]:
    """bf16 KV-like chunks: normal values (exponent bytes repeat, so zstd pays)."""
    rng = np.random.default_rng(seed)
    values = rng.normal(0, 1, (n, layout.chunk_bytes // 2)).astype(np.float32)
    out = []
    for v in values:
        raw = np.empty(layout.chunk_bytes, np.uint8)
        from_float32(v, "bfloat16", raw)
        out.append(raw)
    return out
