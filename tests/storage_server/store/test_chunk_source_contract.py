"""The chunk-source contract: the KV path's lookup, batched puts and pinned reads, specified once."""

from __future__ import annotations

import ctypes
import os

import pytest
from storesupport import code_of

from protocol.errors import ErrorCode, S3Error
from storage_server.store import ChunkHandle

CHUNK = 64


def chunk(i: int) -> bytes:
    return bytes([i % 256]) * CHUNK


def read(h: ChunkHandle) -> bytes:
    """A pinned chunk's bytes through its descriptor; where it is also mapped, the mapping must hold the same."""
    data = os.pread(h.fd, h.size, h.offset)
    if h.mapped is not None:
        arena = h.mapped.arena
        assert bytes((ctypes.c_uint8 * h.size).from_address(arena.base + h.mapped.index * arena.slot_bytes + h.offset)) == data
    return data


def test_longest_prefix_counts_leading_stored_keys(opened):
    async def scenario(store, chunks):
        await store.create_bucket("kvs", "alice", "us-east-1")
        keys = [f"m/{i}" for i in range(6)]
        assert await chunks.longest_prefix("kvs", keys) == 0
        await chunks.put_chunks("kvs", [(k, memoryview(chunk(i))) for i, k in enumerate(keys[:4])], "alice")
        assert await chunks.longest_prefix("kvs", keys) == 4
        assert await chunks.longest_prefix("kvs", keys[:3]) == 3
        assert await chunks.longest_prefix("kvs", ["m/missing", *keys]) == 0
        assert await code_of(chunks.longest_prefix("nope", keys)) == ErrorCode.NoSuchBucket

    opened(scenario)


def test_put_chunks_is_idempotent_for_identical_bytes_and_refuses_different_ones(opened):
    async def scenario(store, chunks):
        await store.create_bucket("kvs", "alice", "us-east-1")
        etags = await chunks.put_chunks("kvs", [("k", memoryview(chunk(1)))], "alice")
        assert await chunks.put_chunks("kvs", [("k", memoryview(chunk(1)))], "alice") == etags
        assert await code_of(chunks.put_chunks("kvs", [("k", memoryview(chunk(2)))], "alice")) == ErrorCode.InvalidRequest
        assert (await store.head_object("kvs", "k")).etag == etags[0]  # chunks are ordinary objects too

    opened(scenario)


def test_pinned_chunks_read_back_exactly_what_was_put(opened):
    async def scenario(store, chunks):
        await store.create_bucket("kvs", "alice", "us-east-1")
        keys = [f"m/{i}" for i in range(5)]
        await chunks.put_chunks("kvs", [(k, memoryview(chunk(i))) for i, k in enumerate(keys)], "alice")
        pinned = await chunks.pin("kvs", keys[::-1])
        try:
            assert [read(h) for h in pinned.handles] == [chunk(i) for i in reversed(range(5))]
        finally:
            pinned.release()
        pinned.release()  # releasing twice is harmless

    opened(scenario)


def test_pin_names_the_first_missing_key_and_pins_nothing(opened):
    async def scenario(store, chunks):
        await store.create_bucket("kvs", "alice", "us-east-1")
        await chunks.put_chunks("kvs", [("a", memoryview(chunk(1)))], "alice")
        with pytest.raises(S3Error) as e:
            await chunks.pin("kvs", ["a", "b", "c"])
        assert e.value.code == ErrorCode.NoSuchKey and e.value.extra["Key"] == "b"

    opened(scenario)


def test_a_pinned_chunk_keeps_its_bytes_while_it_is_deleted_or_replaced(opened):
    async def scenario(store, chunks):
        await store.create_bucket("kvs", "alice", "us-east-1")
        await chunks.put_chunks("kvs", [("gone", memoryview(chunk(7))), ("plain", memoryview(chunk(8)))], "alice")
        pinned = await chunks.pin("kvs", ["gone", "plain"])
        try:
            await store.delete_many("kvs", ["gone", "plain"])
            assert await chunks.longest_prefix("kvs", ["gone"]) == 0
            await chunks.put_chunks("kvs", [("plain", memoryview(chunk(9)))], "alice")  # a new chunk under the old key
            assert [read(h) for h in pinned.handles] == [chunk(7), chunk(8)]
        finally:
            pinned.release()

    opened(scenario)
