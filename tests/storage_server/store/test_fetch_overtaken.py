"""A chunk the capacity tier is fetching for a kv-get when a delete and a new write of its key go through the same
node: the cache ends up holding the new bytes, never the old ones the GET may have brought.

The GET is held open after its bytes arrived and before they are committed (a stream feed that waits
on an event: the only stand-in, since a real GET of a small chunk is too quick to overtake). Before
the fix the old bytes were committed over the new write's cached copy and served by every kv-get
until the copy was next revalidated (a minute by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
from pathlib import Path

from upstream import shared_moto

from protocol.config import load_config
from storage_server.store import open_chunk_source, open_object_store

CHUNK = 4096


class HeldFeed:
    """A stream feed that decodes nothing and holds the first fetch's bytes until the test lets them go."""

    off = False

    def __init__(self) -> None:
        self.arrived, self.go = threading.Event(), threading.Event()

    def feed(self, path: Path, written: int) -> None:
        self.arrived.set()
        assert self.go.wait(30), "the test never let the fetch go on"

    def finish(self, path: Path) -> None:
        pass

    def abandon(self) -> None:
        pass


def read(pinned) -> bytes:
    handle = pinned.handles[0]
    return os.pread(handle.fd, CHUNK, handle.offset)


@contextlib.asynccontextmanager
async def held_fetch(tmp_path: Path):
    """A capacity tier over moto whose kv-get of ``k0`` (b"\x01"s, in the upstream only) has its bytes in and is held
    before their commit; yields (store, chunk source, k0's cache id, the feed holding it, the pin)."""
    moto = shared_moto(Path(tempfile.gettempdir()))
    moto.reset()
    config_path = tmp_path / "store.toml"
    config_path.write_text(f'[store]\ndata_dir = "{tmp_path / "data"}"\nbackend = "s3"\n{moto.config()}\n')
    config = load_config(config_path, env={})
    store = open_object_store(config)
    chunks = open_chunk_source(config, store)
    feed = HeldFeed()
    try:
        await store.create_bucket("kvs", "alice", "us-east-1")
        await chunks.put_chunks("kvs", [("k0", memoryview(b"\x01" * CHUNK))], "alice")
        cid = chunks.cached_size(await store.bucket_id("kvs"), "k0")[0]
        chunks.files.drop(cid)  # k0: in the upstream only
        chunks.decode_while_fetching(lambda key, tenant, size, rate: feed)
        pin = asyncio.ensure_future(chunks.pin("kvs", ["k0"]))
        assert await asyncio.to_thread(feed.arrived.wait, 30), "k0 was never fetched"
        yield store, chunks, cid, feed, pin
    finally:
        feed.go.set()
        if "pin" in locals() and not pin.done():  # the test failed before it: no pin left pending
            pin.cancel()
            await asyncio.gather(pin, return_exceptions=True)
        await chunks.close()
        await store.close()


def test_a_fetch_overtaken_by_a_delete_and_a_new_write_caches_the_new_bytes(tmp_path: Path):
    async def scenario() -> None:
        async with held_fetch(tmp_path) as (store, chunks, cid, feed, pin):
            await store.delete_object("kvs", "k0")  # the old bytes are in the GET's temp file, not committed yet
            await chunks.put_chunks("kvs", [("k0", memoryview(b"\x02" * CHUNK))], "alice")
            feed.go.set()
            pinned = await pin
            try:
                assert read(pinned) == b"\x02" * CHUNK  # the write this node acknowledged
            finally:
                pinned.release()
            assert chunks.fetches.fetched == 0  # the overtaken GET's bytes were never committed: the write's copy is read
            assert not chunks.stale(cid)  # the mark is cleared with the fetch, not left for a later claim
            pinned = await chunks.pin("kvs", ["k0"])  # a later kv-get: a hit, on the new bytes
            try:
                assert read(pinned) == b"\x02" * CHUNK
            finally:
                pinned.release()
            assert chunks.fetches.fetched == 0
            assert chunks.files.policy.pinned_bytes == 0

    asyncio.run(scenario())


def test_a_fetch_overtaken_by_a_delete_answers_no_such_key(tmp_path: Path):
    async def scenario() -> None:
        async with held_fetch(tmp_path) as (store, chunks, cid, feed, pin):
            await store.delete_object("kvs", "k0")
            feed.go.set()
            try:
                await pin
            except Exception as e:  # noqa: BLE001 - the S3 error is what is checked
                assert getattr(e, "code", None) is not None and e.code.name == "NoSuchKey", e
            else:
                raise AssertionError("a kv-get of a chunk deleted during its fetch was served")
            assert chunks.files.size(cid) is None and chunks.files.policy.pinned_bytes == 0 and chunks.fetches.fetched == 0

    asyncio.run(scenario())
