"""Helpers for KV-path tests: deterministic chunks and the numpy reference assembly."""

from __future__ import annotations

import asyncio
import json
import socket

import numpy as np
import pytest

from client_sdk import KVLayout, ObjectCacheClient, chunk_keys


def tiny_layout(chunk_tokens: int, num_layers: int = 32) -> KVLayout:
    """Real layout arithmetic with small S (2·G bytes per layer) so N=3,584 fits a test."""
    return KVLayout(num_layers=num_layers, chunk_tokens=chunk_tokens, kv_heads=1, head_dim=1, dtype="uint8")


def make_chunks(layout: KVLayout, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return list(rng.integers(0, 256, size=(n, layout.chunk_bytes), dtype=np.uint8))


def reference(layout: KVLayout, chunks: list[np.ndarray]) -> np.ndarray:
    """[L][N][S]: layer ℓ of chunk j is bytes [ℓS, (ℓ+1)S) of chunk j."""
    s = layout.per_layer_chunk_bytes
    stacked = np.stack(chunks).reshape(len(chunks), layout.num_layers, s)
    return np.ascontiguousarray(stacked.transpose(1, 0, 2)).reshape(layout.num_layers, -1)


def keys_for(layout: KVLayout, n: int, namespace: str) -> list[str]:
    tokens = np.arange(n * layout.chunk_tokens) % 50000
    return chunk_keys(tokens, layout.chunk_tokens, namespace)


def client(server, tenant, bucket: str) -> ObjectCacheClient:
    return ObjectCacheClient(server.endpoint, tenant.access_key, tenant.secret_key, bucket=bucket)


def rpc(socket_path: str, op: str, **fields) -> dict:
    """Talk to the storage-server daemon directly (test hooks, status)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(socket_path)
        s.sendall(json.dumps({"op": op, **fields}).encode() + b"\n")
        return json.loads(s.makefile("rb").readline())


def run(coro):
    return asyncio.run(coro)


def _rdma_param():
    from client_sdk.rdma import rdma_available

    available, why = rdma_available()
    return pytest.param("rdma", marks=pytest.mark.skipif(not available, reason=f"rdma transport unavailable here: {why}"))


# Every transport a KV test should cover: rdma runs for real (NIXL over UCX's CMA/TCP) where nixl is installed.
TRANSPORTS = ["shm", "http", _rdma_param()]


def put_and_fetch(server, tenant, bucket: str, n: int, seed: int = 0, **fetch_kw):
    """A new bucket with ``n`` tiny chunks, fetched once through the SDK; (payload, FetchStats)."""
    from support import boto_client

    boto_client(server.endpoint, tenant).create_bucket(Bucket=bucket)
    layout = tiny_layout(16)
    keys = keys_for(layout, n, bucket)

    async def go():
        async with client(server, tenant, bucket) as c:
            await c.put_chunks(keys, make_chunks(layout, n, seed=seed), layout)
            return await c.fetch(keys, layout, **fetch_kw)

    return run(go())
