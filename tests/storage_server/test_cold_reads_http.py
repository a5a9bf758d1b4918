"""Cold transfers over http (and rdma) read past the page cache too: the staging buffers are page-aligned (rdma's
registered ones too), so a layerwise http or rdma kv-get whose layer fits one piece reads each layer of every chunk with O_DIRECT into the rotating staging buffer,
byte-exact, CRC-checked, in layer order; and under ``read_path = "planner"`` with a page-cache budget too small
for the prefix (``storage_server.page_cache_max_bytes``) it splits (the first layers through the page cache, the rest
direct), still byte-exact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from kvsupport import client, keys_for, make_chunks, reference, run
from pagecache import evict_tree
from support import boto_client, split_serving

from client_sdk import KVLayout
from client_sdk.rdma import rdma_available

LAYOUT = KVLayout(num_layers=12, chunk_tokens=16, kv_heads=1, head_dim=128, dtype="bfloat16")  # S = 8 KiB: O_DIRECT-aligned
N = 40


def fetch_cold_http(tmp_path: Path, extra: str = "", transport: str = "http"):
    with split_serving(tmp_path, extra) as (storage, gateway, tenant):
        boto_client(gateway.endpoint, tenant).create_bucket(Bucket="cold")
        keys, chunks = keys_for(LAYOUT, N, "cold"), make_chunks(LAYOUT, N, seed=5)

        async def put():
            async with client(gateway, tenant, "cold") as c:
                await c.put_chunks(keys, chunks, LAYOUT)

        run(put())
        storage.stop()
        storage.start()
        evict_tree(tmp_path / "data" / "objects")  # the chunk files: what the sample probes

        async def fetch():
            async with client(gateway, tenant, "cold") as c:
                async with c.fetch_layers(keys, LAYOUT, transport, mode="layerwise", verify=True) as layers:
                    order = [i async for i, _ in layers]
                    return np.frombuffer(layers.payload, np.uint8).reshape(LAYOUT.num_layers, -1).copy(), order, layers.stats

        return reference(LAYOUT, chunks), run(fetch())


def test_a_cold_prefix_over_http_is_read_o_direct_into_aligned_staging_byte_exact(tmp_path):
    expected, (got, order, stats) = fetch_cold_http(tmp_path)
    assert np.array_equal(got, expected) and order == list(range(LAYOUT.num_layers))
    assert stats.server.resident_sample <= 0.5 and stats.server.direct_read_bytes == N * LAYOUT.chunk_bytes


def test_the_planner_splits_a_cold_http_transfer_byte_exact(tmp_path):
    layer = N * LAYOUT.per_layer_chunk_bytes
    expected, (got, order, stats) = fetch_cold_http(tmp_path, f'read_path = "planner"\npage_cache_max_bytes = {4 * layer + 100}\n')
    assert np.array_equal(got, expected) and order == list(range(LAYOUT.num_layers))
    assert stats.server.read_ahead_bytes == 4 * layer and stats.server.direct_read_bytes == (LAYOUT.num_layers - 4) * layer


@pytest.mark.skipif(not rdma_available()[0], reason=f"rdma transport unavailable here: {rdma_available()[1]}")
def test_a_cold_prefix_over_rdma_is_read_o_direct_into_aligned_registered_staging_byte_exact(tmp_path):
    expected, (got, order, stats) = fetch_cold_http(tmp_path, transport="rdma")
    assert np.array_equal(got, expected) and order == list(range(LAYOUT.num_layers))
    assert stats.transport == "rdma"
    assert stats.server.resident_sample <= 0.5 and stats.server.direct_read_bytes == N * LAYOUT.chunk_bytes
