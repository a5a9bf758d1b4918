"""Durability of the local-disk store: what a write acknowledged survives a power cut.

The crash tests SIGKILL processes, which the page cache survives; these reopen the store from a
crash image (:class:`lossydisk.LossyDisk`) in which every byte and directory entry the store did
not sync is gone, for each kind of write, and check the index's own sync settings.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from lossydisk import LossyDisk, index_is_synchronous

from storage_server.store.localdisk.store import LocalDiskStore
from storage_server.store.object_store import PutSpec


async def _body(data: bytes):
    yield data


def _data(i: int, size: int = 4096) -> bytes:
    return (hashlib.sha256(str(i).encode()).digest() * (size // 32 + 1))[:size]


async def _read(store: LocalDiskStore, bucket: str, key: str) -> bytes:
    reader = await store.open_object(bucket, key)
    try:
        return b"".join([c async for c in reader.stream()])
    finally:
        reader.close()


def _crash_and_reopen(tmp_path: Path, writes, check) -> list[str]:
    """Run ``writes(store)`` on a fresh store while recording its syncs, crash, then ``check(reopened)``
    on the image, put where the store was (the index may name files by absolute path); returns what the crash lost."""
    async def go() -> list[str]:
        store = LocalDiskStore(tmp_path / "data", io_threads=4)
        try:
            await store.create_bucket("b", "alice", "us-east-1")
            with LossyDisk(store.root) as disk:
                await writes(store)
                lost = disk.crash_image(tmp_path / "image")
        finally:
            await store.close()
        (tmp_path / "data").rename(tmp_path / "before-the-crash")
        (tmp_path / "image").rename(tmp_path / "data")
        reopened = LocalDiskStore(tmp_path / "data", io_threads=2)
        try:
            await check(reopened)
        finally:
            await reopened.close()
        return lost

    return asyncio.run(go())


def test_an_acknowledged_put_survives_a_power_cut(tmp_path):
    async def writes(store):
        await store.put_object("b", "k", _body(_data(1)), PutSpec(), "alice")

    async def check(store):
        assert await _read(store, "b", "k") == _data(1)

    lost = _crash_and_reopen(tmp_path, writes, check)
    assert all(p.startswith("tmp/") for p in lost), lost  # only temp files may go


def test_concurrent_puts_survive_a_power_cut(tmp_path):
    async def writes(store):
        await asyncio.gather(*(store.put_object("b", f"k{i}", _body(_data(i)), PutSpec(), "alice") for i in range(8)))

    async def check(store):
        for i in range(8):
            assert await _read(store, "b", f"k{i}") == _data(i)

    _crash_and_reopen(tmp_path, writes, check)


def test_a_batched_kv_put_survives_a_power_cut(tmp_path):
    items = [(f"chunk/{i}", _data(i, 1024), PutSpec(immutable=True)) for i in range(16)]

    async def writes(store):
        await store.put_many("b", items, "alice")

    async def check(store):
        for key, data, _ in items:
            assert await _read(store, "b", key) == data

    _crash_and_reopen(tmp_path, writes, check)


def test_a_completed_multipart_upload_and_a_copy_survive_a_power_cut(tmp_path):
    parts = [_data(10, 5 << 20), _data(11, 1000)]

    async def writes(store):
        upload = await store.create_upload("b", "mp", PutSpec(), "alice")
        done = [await store.upload_part(upload, n, _body(p), PutSpec()) for n, p in enumerate(parts, 1)]
        await store.complete_upload(upload, [(p.part_number, p.etag, {}) for p in done])
        await store.copy_object(await store.head_object("b", "mp"), "b", "copy", PutSpec(), "alice")

    async def check(store):
        assert await _read(store, "b", "mp") == b"".join(parts)
        assert await _read(store, "b", "copy") == b"".join(parts)

    _crash_and_reopen(tmp_path, writes, check)


def test_acknowledged_parts_of_an_open_upload_survive_a_power_cut(tmp_path):
    async def writes(store):
        upload = await store.create_upload("b", "open", PutSpec(), "alice")
        await store.upload_part(upload, 1, _body(_data(20, 5 << 20)), PutSpec())
        writes.upload = upload

    async def check(store):
        upload = await store.get_upload("b", "open", writes.upload.upload_id)
        (part,) = await store.list_parts(upload)
        done = await store.complete_upload(upload, [(1, part.etag, {})])
        assert done.size == 5 << 20 and await _read(store, "b", "open") == _data(20, 5 << 20)

    _crash_and_reopen(tmp_path, writes, check)


def test_the_index_commits_durably(tmp_path):
    """SQLite syncs in C, out of LossyDisk's sight: WAL with synchronous=FULL is what makes a commit durable."""
    store = LocalDiskStore(tmp_path / "data", io_threads=1)
    try:
        assert index_is_synchronous(store.index._connect) == ("wal", 2)
        assert store.index.db.execute("PRAGMA synchronous").fetchone()[0] == 2
    finally:
        asyncio.run(store.close())


def test_the_crash_image_drops_what_was_not_synced(tmp_path):
    """The tool itself: bytes and names written without a sync are gone from the image."""
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    with LossyDisk(root) as disk:
        (root / "d" / "unsynced").write_bytes(b"x")
        (root / "new").mkdir()
        with open(root / "d" / "synced", "wb") as f:
            f.write(b"y")
            f.flush()
            __import__("os").fsync(f.fileno())
        lost_before_dir_sync = disk.crash_image(tmp_path / "i1")
        from storage_server.store.localdisk.blobs import fsync_dir

        fsync_dir(root / "d")
        (root / "d" / "synced").write_bytes(b"changed")
        lost_after = disk.crash_image(tmp_path / "i2")
    assert sorted(lost_before_dir_sync) == ["d/synced (entry)", "d/unsynced (entry)", "new (entry)"]
    assert sorted(lost_after) == ["d/synced (bytes)", "d/unsynced (bytes)", "new (entry)"]
    assert (tmp_path / "i2" / "d" / "unsynced").read_bytes() == (tmp_path / "i2" / "d" / "synced").read_bytes() == b""
