"""Group commit in the local-disk store: concurrent PUTs share the directory fsync and the index commit,
each acknowledged only once the barriers covering it returned, and one PUT's failure stays its own.

Real store on a real disk. To make "concurrent" deterministic, another connection holds the SQLite
write lock (as another writer process would): the first PUT's batch waits on it, the PUTs that
arrive meanwhile queue, and they must then commit together in the next batch.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import time

from lossydisk import LossyDisk

from protocol.errors import ErrorCode, S3Error
from storage_server.store.localdisk.store import LocalDiskStore
from storage_server.store.object_store import PutSpec

N = 8


async def _body(data: bytes):
    yield data


def _data(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * 128  # 4 KiB


async def _wait_until(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def _held_batch(store: LocalDiskStore, puts: list[tuple[str, bool]]) -> list[object]:
    """Run ``puts`` ((key, immutable); body ``_data(i)``) while the index's write lock is held elsewhere; release once all but the first queued."""
    blocker = sqlite3.connect(store.index.db_path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        tasks = [asyncio.ensure_future(store.put_object("b", k, _body(_data(i)), PutSpec(immutable=imm), "alice")) for i, (k, imm) in enumerate(puts)]
        await _wait_until(lambda: store._group.queued() == len(puts) - 1)
    finally:
        blocker.execute("COMMIT")
        blocker.close()
    return await asyncio.gather(*tasks, return_exceptions=True)


def with_store(tmp_path, test) -> None:
    async def go():
        s = LocalDiskStore(tmp_path / "data", io_threads=N + 2)
        try:
            await s.create_bucket("b", "alice", "us-east-1")
            await test(s)
        finally:
            await s.close()

    asyncio.run(go())


def test_concurrent_puts_commit_in_one_batch_and_are_all_durable(tmp_path):
    """Durable: the store reopened from the image a power cut right after the acknowledgements would
    leave (every byte and directory entry not synced dropped) still holds all N objects."""
    disk = LossyDisk(tmp_path / "data")

    async def batch_then_crash(store: LocalDiskStore) -> None:
        with disk:
            await _concurrent(store)
            disk.crash_image(tmp_path / "image")

    with_store(tmp_path, batch_then_crash)
    (tmp_path / "data").rename(tmp_path / "before-the-crash")  # the index names files by absolute path
    (tmp_path / "image").rename(tmp_path / "data")

    async def reopened() -> None:
        store = LocalDiskStore(tmp_path / "data", io_threads=2)
        try:
            for i in range(N):
                assert (await _read(store, f"k{i}"))[1] == _data(i)
        finally:
            await store.close()

    asyncio.run(reopened())


def test_a_failing_put_fails_alone(tmp_path):
    with_store(tmp_path, _one_fails)


async def _concurrent(store: LocalDiskStore) -> None:
    results = await _held_batch(store, [(f"k{i}", False) for i in range(N)])
    assert all(not isinstance(r, BaseException) for r in results), results
    # One batch for the first PUT (held by the lock), one for the N-1 that queued behind it.
    assert (store._group.batches, store._group.committed) == (2, N)
    for i in range(N):
        meta, body = await _read(store, f"k{i}")
        assert body == _data(i) and meta.etag == f'"{hashlib.md5(body).hexdigest()}"'
    # The batch's files went into one directory (one fsync of it).
    dirs = {p.parent for p in store.blobs.objects_dir.rglob("*") if p.is_file()}
    assert len(dirs) == 2
    assert not any(store.blobs.tmp_dir.iterdir())


async def _one_fails(store: LocalDiskStore) -> None:
    # An immutable chunk already stored with other bytes: putting it again in the batch is refused.
    await store.put_object("b", "k2", _body(b"other bytes"), PutSpec(immutable=True), "alice")
    results = await _held_batch(store, [("k0", False), ("k1", True), ("k2", True), ("k3", False)])
    assert isinstance(results[2], S3Error) and results[2].code == ErrorCode.InvalidRequest and "immutable" in results[2].message
    assert [isinstance(r, BaseException) for r in results] == [False, False, True, False]
    for i in (0, 1, 3):
        assert (await _read(store, f"k{i}"))[1] == _data(i)
    assert (await _read(store, "k2"))[1] == b"other bytes"
    files = [p for p in store.blobs.objects_dir.rglob("*") if p.is_file()]
    assert len(files) == 4  # the refused PUT's file is gone, not orphaned
    assert not any(store.blobs.tmp_dir.iterdir())


async def _read(store: LocalDiskStore, key: str):
    reader = await store.open_object("b", key)
    try:
        return reader.meta, b"".join([c async for c in reader.stream()])
    finally:
        reader.close()
