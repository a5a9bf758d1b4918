"""Chunk keys: a rolling prefix hash over fixed-size token chunks.

``H_-1 = BLAKE2b-128("objectcache/v1\\0" || namespace)`` and
``H_i = BLAKE2b-128(H_{i-1} || tokens_i)`` where ``tokens_i`` is the i-th run of
``chunk_tokens`` token ids as little-endian uint32. The key of chunk i is
``f"{namespace}/{H_i.hex()}"``. Equal keys therefore mean equal prefixes (the
whole history, not just the chunk), the result is the same in every process
and on every machine (no Python ``hash()``), and the namespace — use the model
name and anything else that changes KV values — keeps models apart. Only full
chunks get keys; a trailing partial chunk is not cacheable.

A ``salt`` (vLLM's per-request ``cache_salt``) replaces the seed by
``BLAKE2b-128(H_-1 || BLAKE2b-128("salt\0" || salt))``: requests with different salts (or a
salt and none) never share a key, while the key's readable prefix stays the namespace. The
salt itself never appears in a key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

DIGEST_BYTES = 16
DOMAIN = b"objectcache/v1\0"


def chunk_keys(token_ids: Sequence[int] | np.ndarray, chunk_tokens: int, namespace: str, salt: str | None = None) -> list[str]:
    if chunk_tokens < 1:
        raise ValueError("chunk_tokens must be at least 1")
    if not namespace or "\n" in namespace:
        raise ValueError("namespace must be a non-empty single-line string")
    tokens = np.asarray(token_ids)
    if tokens.ndim != 1:
        raise ValueError("token_ids must be one-dimensional")
    if tokens.size and (tokens.min() < 0 or tokens.max() > 0xFFFFFFFF):
        raise ValueError("token ids must fit in uint32")
    data = tokens.astype("<u4", copy=False).tobytes()
    step = chunk_tokens * 4
    h = hashlib.blake2b(DOMAIN + namespace.encode(), digest_size=DIGEST_BYTES).digest()
    if salt:
        salted = hashlib.blake2b(b"salt\0" + salt.encode(), digest_size=DIGEST_BYTES).digest()
        h = hashlib.blake2b(h + salted, digest_size=DIGEST_BYTES).digest()
    keys = []
    for i in range(len(tokens) // chunk_tokens):
        h = hashlib.blake2b(h + data[i * step : (i + 1) * step], digest_size=DIGEST_BYTES).digest()
        keys.append(f"{namespace}/{h.hex()}")
    return keys
