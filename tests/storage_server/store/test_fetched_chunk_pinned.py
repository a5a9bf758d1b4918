"""A chunk the capacity tier fetches for a kv-get is pinned from the moment it is cached, and that kv-get's touch of
its chain does not count it as a reuse.

Where decoded copies are kept, a fetched chunk's last layers are decoded on a thread after the chunk
is committed and before its pin returns. A chunk left unpinned in that gap could be evicted by another
kv-get's reservation, and the first kv-get then failed with NoSuchKey ("removed while the request was
planned"): seen in ``bench capacity`` on moto under the ``prefix`` policy. The decoder's last step is
held open here (the only stand-in: the real decoder finishes too fast to hold the gap open) while
another reservation needs the room.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from pathlib import Path

from upstream import shared_moto

from protocol.config import load_config
from storage_server.store import open_chunk_source, open_object_store

CHUNK = 4096


class HeldFinish:
    """A stream feed that decodes nothing and whose last step waits until the test lets it go."""

    off = False

    def __init__(self) -> None:
        self.finishing, self.go = threading.Event(), threading.Event()

    def feed(self, path: Path, written: int) -> None:
        pass

    def finish(self, path: Path) -> None:
        self.finishing.set()
        assert self.go.wait(30), "the test never let the decoder finish"

    def abandon(self) -> None:
        pass


def test_a_fetched_chunk_cannot_be_evicted_while_its_decoder_finishes(tmp_path: Path):
    moto = shared_moto(Path(tempfile.gettempdir()))
    moto.reset()
    config_path = tmp_path / "store.toml"
    config_path.write_text(f'[store]\ndata_dir = "{tmp_path / "data"}"\nbackend = "s3"\n{moto.config()}\n'
                           f'[cache]\nmax_bytes = {2 * CHUNK}\n')
    config = load_config(config_path, env={})

    async def scenario() -> None:
        store = open_object_store(config)
        chunks = open_chunk_source(config, store)
        try:
            await store.create_bucket("kvs", "alice", "us-east-1")
            await chunks.put_chunks("kvs", [("k0", memoryview(b"\x01" * CHUNK)), ("k1", memoryview(b"\x02" * CHUNK))], "alice")
            chunks.files.drop(chunks.cached_size(await store.bucket_id("kvs"), "k0")[0])  # k0: in the upstream only
            feed = HeldFinish()
            chunks.decode_while_fetching(lambda key, tenant, size, rate: feed)
            pin = asyncio.ensure_future(chunks.pin("kvs", ["k0"]))
            assert await asyncio.to_thread(feed.finishing.wait, 30), "k0 was never fetched"
            # k0 is cached and its decoder still finishing: a reservation needing the whole cache finds it pinned.
            assert not chunks.files.reserve(2 * CHUNK, "bob")
            assert chunks.files.reserve(CHUNK, "bob")  # k1, unpinned, was the one to go
            chunks.files.unreserve(CHUNK)
            feed.go.set()
            pinned = await pin
            try:
                assert os.pread(pinned.handles[0].fd, CHUNK, pinned.handles[0].offset) == b"\x01" * CHUNK
            finally:
                pinned.release()
            assert chunks.files.policy.pinned_bytes == 0  # the commit's pin is the kv-get's: released once, gone
        finally:
            feed.go.set()
            await chunks.close()
            await store.close()

    asyncio.run(scenario())


def test_a_kv_get_counts_a_use_only_for_the_chunks_it_found_cached(tmp_path: Path):
    """A kv-get touches its whole chain, naming the chunks it brought in itself as fresh: the prefix tree counts a hit
    for a chunk found cached and none for one fetched for this very kv-get (counted, every fetch looked like a reuse).
    Two nodes over one upstream: the chunks are put through one, the other has never held them."""
    moto = shared_moto(Path(tempfile.gettempdir()))
    moto.reset()
    configs = []
    for name in ("putter", "reader"):
        path = tmp_path / f"{name}.toml"
        path.write_text(f'[store]\ndata_dir = "{tmp_path / name}"\nbackend = "s3"\n{moto.config()}\n[cache]\npolicy = "prefix"\n')
        configs.append(load_config(path, env={}))

    async def scenario() -> None:
        opened = [(store, open_chunk_source(c, store)) for c in configs for store in [open_object_store(c)]]
        (store, putter), (reader_store, reader) = opened
        try:
            await store.create_bucket("kvs", "alice", "us-east-1")
            await putter.put_chunks("kvs", [("k0", memoryview(b"\x01" * CHUNK)), ("k1", memoryview(b"\x02" * CHUNK))], "alice")
            bucket_id = await reader_store.bucket_id("kvs")
            first, second = (reader.cached_size(bucket_id, k)[0] for k in ("k0", "k1"))
            (await reader.pin("kvs", ["k1"])).release()  # k1 fetched by a kv-get of its own
            reader.files.policy.flush()  # touches wait for the policy's next decision
            tree = reader.files.policy.policy
            assert tree._nodes[second].hits == 0  # fetched for that kv-get: not a reuse
            (await reader.pin("kvs", ["k0", "k1"])).release()  # k0 fetched now, k1 found cached
            reader.files.policy.flush()
            assert (tree._nodes[first].hits, tree._nodes[second].hits) == (0, 1)
            (await reader.pin("kvs", ["k0", "k1"])).release()  # both found cached
            reader.files.policy.flush()
            assert (tree._nodes[first].hits, tree._nodes[second].hits) == (1, 2)
        finally:
            for store, chunks in opened:
                await chunks.close()
                await store.close()

    asyncio.run(scenario())
