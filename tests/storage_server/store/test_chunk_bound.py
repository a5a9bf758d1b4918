"""cache.max_bytes: how much KV chunk data a node keeps, and what it gives back first."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from protocol.config import load_config
from storage_server.store import PutSpec, open_chunk_source, open_object_store
from storage_server.store.cache.chunk_files import ChunkFiles
from storage_server.store.cache.lru import LruPolicy

CHUNK = 64


def test_eviction_takes_the_oldest_unpinned_entries_and_the_tail_of_a_prefix_before_its_head():
    lru = LruPolicy()
    for k in ["old", "h", "t1", "t2"]:
        lru.add(k, 10)
    lru.touch_chain(["h", "t1", "t2"])  # used together: head newest, tail oldest of the three
    assert lru.victims(20) == ["old", "t2"]
    lru.pin(["old"])
    assert lru.victims(20) == ["t2", "t1"]
    assert lru.victims(40) is None and lru.victims(40, partial=True) == ["t2", "t1", "h"]
    lru.unpin(["old"])
    assert lru.victims(40) == ["old", "t2", "t1", "h"] and lru.used == 40


async def _body(data: bytes):
    yield data


def test_the_local_store_keeps_at_most_max_bytes_of_chunks_and_never_evicts_plain_objects_or_pinned_chunks(tmp_path: Path):
    config_path = tmp_path / "c.toml"
    config_path.write_text(f'[store]\ndata_dir = "{tmp_path / "data"}"\n[cache]\nmax_bytes = {10 * CHUNK}\n')
    config = load_config(config_path, env={})

    async def scenario():
        store = open_object_store(config)
        chunks = open_chunk_source(config, store)
        try:
            await store.create_bucket("kvs", "alice", "us-east-1")
            await store.put_object("kvs", "user-object", _body(b"u" * 20 * CHUNK), PutSpec(), "alice")
            keys = [f"p/{i:02d}" for i in range(20)]
            await chunks.put_chunks("kvs", [(k, memoryview(bytes([i]) * CHUNK)) for i, k in enumerate(keys)], "alice")
            assert await chunks.longest_prefix("kvs", keys) == 10  # the head half of the prefix stayed
            assert chunks.status()["chunk_bytes"]["bytes"] == 10 * CHUNK
            pinned = await chunks.pin("kvs", keys[8:10])
            try:
                others = [f"q/{i:02d}" for i in range(20)]  # twice the bound: everything unpinned must go
                await chunks.put_chunks("kvs", [(k, memoryview(b"q" * CHUNK)) for k in others], "alice")
                assert await chunks.longest_prefix("kvs", keys) == 0 and await chunks.longest_prefix("kvs", keys[8:10]) == 2
                assert await chunks.longest_prefix("kvs", others) == 8  # the pinned two hold the rest of the room
                assert [os.pread(h.fd, h.size, 0) for h in pinned.handles] == [bytes([8]) * CHUNK, bytes([9]) * CHUNK]
            finally:
                pinned.release()
            assert (await store.head_object("kvs", "user-object")).size == 20 * CHUNK
            assert chunks.status()["chunk_bytes"]["bytes"] <= 10 * CHUNK
        finally:
            await chunks.close()
            await store.close()

    asyncio.run(scenario())


def test_a_restarted_chunk_cache_keeps_whole_files_drops_torn_ones_and_honours_a_smaller_bound(tmp_path: Path):
    files = ChunkFiles(tmp_path, max_bytes=10 * CHUNK)
    for i in range(4):
        assert files.reserve(CHUNK)
        tmp = files.new_tmp()
        tmp.write_bytes(bytes([i]) * CHUNK)
        files.commit(f"{i:02d}" * 20, tmp, CHUNK)
    torn = files.path("ff" * 20, CHUNK)
    torn.parent.mkdir(exist_ok=True)
    torn.write_bytes(b"short")  # a crash before the whole chunk was written
    (files.tmp / "partial").write_bytes(b"x")
    again = ChunkFiles(tmp_path, max_bytes=10 * CHUNK)
    assert again.status()["chunks"] == 4 and again.status()["bytes"] == 4 * CHUNK
    assert not torn.exists() and not (files.tmp / "partial").exists()
    assert again.path("03" * 20, CHUNK).read_bytes() == bytes([3]) * CHUNK
    smaller = ChunkFiles(tmp_path, max_bytes=2 * CHUNK)
    assert smaller.status()["bytes"] == 2 * CHUNK and smaller.status()["evicted"] == 2
