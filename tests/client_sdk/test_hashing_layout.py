"""Chunk keys and layouts: deterministic, documented, and exact."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest
from support import REPO

from client_sdk import KVLayout, chunk_keys


def test_keys_follow_the_documented_rolling_hash():
    tokens = list(range(40))
    h = hashlib.blake2b(b"objectcache/v1\0" + b"ns", digest_size=16).digest()
    expected = []
    for i in range(2):  # 40 tokens at G=16: two full chunks, the partial one has no key
        h = hashlib.blake2b(h + np.array(tokens[i * 16 : (i + 1) * 16], dtype="<u4").tobytes(), digest_size=16).digest()
        expected.append(f"ns/{h.hex()}")
    assert chunk_keys(tokens, 16, "ns") == expected


def test_keys_are_the_same_in_another_process():
    code = "from client_sdk import chunk_keys; print(chunk_keys(list(range(100)), 16, 'llama-3.1-8b')[-1])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={"PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO)}, check=True).stdout.strip()
    assert out == chunk_keys(list(range(100)), 16, "llama-3.1-8b")[-1]


def test_prefix_property_and_namespaces():
    a = chunk_keys(list(range(64)), 16, "m")
    b = chunk_keys(list(range(48)) + [999] * 16, 16, "m")
    assert a[:3] == b[:3] and a[3] != b[3]  # equal keys exactly for the shared prefix
    assert chunk_keys(list(range(64)), 16, "other")[0] != a[0]
    c = chunk_keys([7] + list(range(1, 64)), 16, "m")
    assert all(x != y for x, y in zip(a, c))  # a change early changes every later key


@pytest.mark.parametrize("bad", [dict(token_ids=[-1] * 16), dict(token_ids=[2**32] * 16), dict(chunk_tokens=0), dict(namespace="")])
def test_bad_input(bad):
    kw = dict(token_ids=list(range(16)), chunk_tokens=16, namespace="m") | bad
    with pytest.raises(ValueError):
        chunk_keys(**kw)


def test_layout_sizes_and_presets():
    llama = KVLayout.preset("llama-3.1-8b", chunk_tokens=16)
    assert llama.per_layer_chunk_bytes == 2 * 16 * 8 * 128 * 2 == 65536
    assert llama.bytes_per_token_per_layer == 4096  # the design's s_i = cached tokens × 4096 B
    assert llama.chunk_bytes == 32 * 65536
    assert KVLayout.preset("qwen2.5-7b").num_layers == 28
    assert KVLayout.preset("mistral-7b").kv_heads == 8
    assert KVLayout.preset("deepseek-r1-distill-qwen-7b").kv_heads == 4
    with pytest.raises(ValueError, match="unknown model"):
        KVLayout.preset("gpt-5")
    with pytest.raises(ValueError):
        KVLayout(32, 16, 8, 128, dtype="float64")
