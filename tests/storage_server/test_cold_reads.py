"""Cold transfers: when the sampled chunks are not in the page cache, a layerwise shm transfer reads groups of
layers past it (O_DIRECT, many requests in flight), still byte-exact, in layer order, CRC-checked where asked,
paced where a bandwidth pool runs; with ``cold_read_depth = 0`` it reads through the page cache as before."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from kvsupport import client, keys_for, make_chunks, reference, run
from pagecache import evict_tree
from support import boto_client, split_serving

from client_sdk import KVLayout
from storage_server.direct_reads import ALIGN, DirectFiles, aligned, group_layers, read_layer_group

LAYOUT = KVLayout(num_layers=12, chunk_tokens=16, kv_heads=1, head_dim=128, dtype="bfloat16")  # S = 8 KiB: O_DIRECT-aligned
N = 40


def fetch_cold(tmp_path: Path, extra: str = "", verify: bool = False):
    """Put N chunks, restart the storage server, evict the page cache, fetch over shm twice: (payload, stats) each."""
    with split_serving(tmp_path, extra) as (storage, gateway, tenant):
        boto_client(gateway.endpoint, tenant).create_bucket(Bucket="cold")
        keys, chunks = keys_for(LAYOUT, N, "cold"), make_chunks(LAYOUT, N, seed=11)

        async def put():
            async with client(gateway, tenant, "cold") as c:
                await c.put_chunks(keys, chunks, LAYOUT)

        run(put())
        storage.stop()
        storage.start()
        evict_tree(tmp_path / "data" / "objects")  # the chunk files: what the sample probes

        async def fetch_twice():
            out = []
            async with client(gateway, tenant, "cold") as c:
                for _ in range(2):
                    async with c.fetch_layers(keys, LAYOUT, "shm", mode="layerwise", verify=verify) as layers:
                        order = [i async for i, _ in layers]
                        out.append((np.frombuffer(layers.payload, np.uint8).reshape(LAYOUT.num_layers, -1).copy(), order, layers.stats))
            return out

        return reference(LAYOUT, chunks), run(fetch_twice())


def test_a_cold_prefix_is_read_past_the_page_cache_in_layer_order_and_byte_exact(tmp_path):
    expected, ((cold, order, stats), (again, _, _)) = fetch_cold(tmp_path, verify=True)  # verify: the layers' CRCs are checked too
    assert np.array_equal(cold, expected) and order == list(range(LAYOUT.num_layers))
    assert stats.server.resident_sample <= 0.5 and stats.server.direct_read_bytes == N * LAYOUT.chunk_bytes
    timeline = stats.server.layer_timeline
    assert [t[2] for t in timeline] == sorted(t[2] for t in timeline) and all(t[0] <= t[1] <= t[2] for t in timeline)
    assert np.array_equal(again, expected)


def test_cold_read_depth_0_reads_cold_chunks_through_the_page_cache(tmp_path):
    expected, ((cold, order, stats), _) = fetch_cold(tmp_path, "cold_read_depth = 0\n")
    assert np.array_equal(cold, expected) and order == list(range(LAYOUT.num_layers))
    assert stats.server.resident_sample < 1.0 and stats.server.direct_read_bytes == 0 and stats.server.read_ahead_bytes > 0


def test_a_paced_cold_transfer_is_read_past_the_page_cache_within_its_allocation(tmp_path):
    expected, ((cold, _, stats), _) = fetch_cold(tmp_path, '\n[bandwidth]\ncapacity_gbps = 100.0\npolicy = "equal"\n')
    assert np.array_equal(cold, expected) and stats.server.direct_read_bytes == N * LAYOUT.chunk_bytes
    alloc = stats.server.allocation
    # The lone transfer is allocated the whole 100 Gbit/s, and by the server's own token-bucket accounting
    # (bytes past the burst over the time since admission) it was not sent faster than that.
    assert alloc["policy"] == "equal" and alloc["rate_bytes_per_s"] == 100e9 / 8, alloc
    assert 0 <= alloc["delivered_bytes_per_s"] <= alloc["rate_bytes_per_s"], alloc


def test_a_group_of_layers_is_one_read_per_chunk_into_each_layers_place(tmp_path):
    size, layers, n = 2 * ALIGN, 6, 5
    data = np.random.default_rng(5).integers(0, 256, (n, layers * size), dtype=np.uint8)
    paths = []
    for j in range(n):
        paths.append(tmp_path / f"c{j}")
        paths[-1].write_bytes(data[j].tobytes())
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    memory = np.zeros(3 * n * size + ALIGN, np.uint8)
    base = (-memory.ctypes.data) % ALIGN  # an aligned start, as a shm region's pages are
    dests = [memoryview(memory[base + i * n * size : base + (i + 1) * n * size]) for i in range(3)]
    assert aligned(size, [0] * n, dests) and not aligned(size + 512, [0] * n, dests) and not aligned(size, [0] * n, [dests[0][1:]])
    files = DirectFiles.open(fds)
    assert files is not None, "this filesystem takes O_DIRECT"
    try:
        read_layer_group(files, [0] * n, 0, n, 2, size, dests)  # layers 2, 3, 4
    finally:
        files.close()
        for fd in fds:
            os.close(fd)
    for i, layer in enumerate(range(2, 5)):
        got = np.frombuffer(dests[i], np.uint8).reshape(n, size)
        assert np.array_equal(got, data[:, layer * size : (layer + 1) * size])
    assert group_layers(16 << 10, 32) == 16 and group_layers(1 << 20, 32) == 1 and group_layers(512, 4) == 4


def test_direct_descriptors_are_closed_once(tmp_path):
    p = tmp_path / "c"
    p.write_bytes(bytes(ALIGN))
    fd = os.open(p, os.O_RDONLY)
    before = len(os.listdir("/proc/self/fd"))
    files = DirectFiles.open([fd] * 3)
    assert files is not None and len(os.listdir("/proc/self/fd")) == before + 1  # the probe; the others by the reader that needs each
    files.fd(0), files.fd(2)
    assert len(os.listdir("/proc/self/fd")) == before + 2
    files.close()
    files.close()  # closing twice is harmless
    assert len(os.listdir("/proc/self/fd")) == before
    os.close(fd)
