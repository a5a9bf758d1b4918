"""A repeated prefix is pinned from what an earlier kv-get resolved — never past a change of its chunks."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from kvsupport import client, keys_for, make_chunks, reference, rpc, run, tiny_layout

from client_sdk import ObjectCacheError
from protocol.wire import Descriptor, Target, decode_descriptor, encode_descriptor
from storage_server.store.localdisk.chunks import LocalDiskChunkSource
from storage_server.store.localdisk.store import LocalDiskStore


def resolved(server) -> dict:
    return rpc(server.rpc_socket, "status")["resolved_prefixes"]


@pytest.mark.parametrize("transport", ["shm", "http"])
def test_an_overwrite_or_delete_between_two_fetches_is_seen(server, tenants, s3, transport):
    bucket = f"resolved-{transport}"
    s3.create_bucket(Bucket=bucket)
    layout = tiny_layout(16)
    keys = keys_for(layout, 64, f"resolved-{transport}")
    chunks = make_chunks(layout, 64, seed=11)

    async def scenario():
        async with client(server, tenants["alice"], bucket) as c:
            await c.put_chunks(keys, chunks, layout)
            first, _ = await c.fetch(keys, layout, transport)
            before = resolved(server)
            again, _ = await c.fetch(keys, layout, transport)
            assert np.array_equal(first, reference(layout, chunks)) and np.array_equal(again, first)
            assert resolved(server)["hits"] > before["hits"], "the repeat did not reuse what the first fetch resolved"

            # Overwrite chunk 5 (chunks are immutable: deleted, then stored again with other bytes) ...
            s3.delete_object(Bucket=bucket, Key=keys[5])
            replaced = make_chunks(layout, 1, seed=12)[0]
            await c.put_chunks([keys[5]], [replaced], layout)
            changed = [replaced if i == 5 else ch for i, ch in enumerate(chunks)]
            after, _ = await c.fetch(keys, layout, transport)
            assert np.array_equal(after, reference(layout, changed)), "a fetch after the overwrite read the old bytes"

            # ... and delete chunk 7: the same prefix is now incomplete.
            s3.delete_object(Bucket=bucket, Key=keys[7])
            with pytest.raises(ObjectCacheError) as e:
                await c.fetch(keys, layout, transport)
            assert e.value.code.name == "NoSuchKey" and keys[7] in e.value.message

    run(scenario())


def test_kept_prefixes_do_not_shield_chunks_from_eviction(tmp_path):
    """Idle kept prefixes hold their chunks pinned only until an eviction needs the room."""
    size = 1024

    async def scenario():
        store = LocalDiskStore(tmp_path, 2)
        chunks = LocalDiskChunkSource(store, 64, 10 * size, policy="lru")
        try:
            await store.create_bucket("kvs", "t", "us-east-1")
            old = [f"p/{i:02x}" for i in range(8)]
            await chunks.put_chunks("kvs", [(k, memoryview(bytes([i]) * size)) for i, k in enumerate(old)], "t")
            keys = decode_descriptor(encode_descriptor(Descriptor(old, 1, 1, size, Target(length=8 * size)))).chunk_keys
            (await chunks.pin("kvs", keys)).release()
            assert chunks.status()["resolved_prefixes"]["entries"] == 1
            new = [f"q/{i:02x}" for i in range(8)]  # 16 chunks for a bound of 10: six of the old ones must go
            await chunks.put_chunks("kvs", [(k, memoryview(bytes([100 + i]) * size)) for i, k in enumerate(new)], "t")
            assert await chunks.longest_prefix("kvs", old) < 8
            assert chunks.status()["chunk_bytes"]["bytes"] <= 10 * size
        finally:
            await chunks.close()
            await store.close()

    asyncio.run(scenario())
