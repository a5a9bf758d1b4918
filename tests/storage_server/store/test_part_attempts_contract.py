"""A part re-sent while its first attempt is still running (issue 23 item 11): whichever attempt's ETag
CompleteMultipartUpload names is the part, on every backend, whichever attempt started or finished first;
abort and completion leave no attempt behind."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

from storesupport import body, code_of, read_all

from protocol.errors import ErrorCode
from storage_server.store import PutSpec

SPEC = PutSpec()


class HeldBody:
    """A part body whose first piece is read at once and whose rest waits until :meth:`release`."""

    def __init__(self, data: bytes) -> None:
        self.data, self.reading, self.go = data, asyncio.Event(), asyncio.Event()

    async def stream(self) -> AsyncIterator[bytes]:
        yield self.data[:1]
        self.reading.set()
        await self.go.wait()
        yield self.data[1:]

    def release(self) -> None:
        self.go.set()


def _etag(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


async def _first_finishes_last(store, upload, first: bytes, second: bytes) -> tuple[str, str]:
    """Attempt 1 starts and is held mid-body; attempt 2 runs whole; then attempt 1 finishes: both ETags."""
    held = HeldBody(first)
    one = asyncio.create_task(store.upload_part(upload, 1, held.stream(), SPEC))
    await asyncio.wait_for(held.reading.wait(), 30)
    two = await store.upload_part(upload, 1, body(second), SPEC)
    held.release()
    return (await asyncio.wait_for(one, 30)).etag, two.etag


def test_complete_takes_the_attempt_whose_etag_it_names(opened):
    async def scenario(store, _):
        await store.create_bucket("attempts", "alice", "us-east-1")
        first, second = b"A" * 3000, b"B" * 2000
        for named, want in (("first", first), ("second", second)):
            key = f"obj-{named}"
            upload = await store.create_upload("attempts", key, SPEC, "alice")
            etags = await _first_finishes_last(store, upload, first, second)
            assert etags == (_etag(first), _etag(second))
            etag = etags[0] if named == "first" else etags[1]
            meta = await store.complete_upload(upload, [(1, etag, {})])
            assert meta.size == len(want)
            assert await read_all(store, "attempts", key) == want
            assert await code_of(store.get_upload("attempts", key, upload.upload_id)) == ErrorCode.NoSuchUpload
            assert await _leftovers(store, "attempts", upload.upload_id) == []

    opened(scenario)


async def _leftovers(store, bucket: str, upload_id: str) -> list[str]:
    """What the store still keeps of an upload's parts and attempts: its part files (local) or reserved keys (s3)."""
    if hasattr(store, "blobs"):
        folder = store.blobs.parts_dir / upload_id
        return [p.name for p in folder.iterdir()] if folder.exists() else []
    from storage_server.store.s3.listing import list_page

    page = await list_page(store.up, bucket, ".objectcache/uploads/", "", "", 1000, hide_reserved=False)
    return [o.key for o in page.objects if upload_id.replace("/", "_") in o.key]


def test_a_complete_naming_neither_attempt_is_invalid_part_and_abort_cleans_all(opened):
    async def scenario(store, _):
        await store.create_bucket("attempts2", "alice", "us-east-1")
        upload = await store.create_upload("attempts2", "k", SPEC, "alice")
        await _first_finishes_last(store, upload, b"x" * 100, b"y" * 100)
        assert await _leftovers(store, "attempts2", upload.upload_id)  # both attempts are kept meanwhile
        assert await code_of(store.complete_upload(upload, [(1, _etag(b"z" * 100), {})])) == ErrorCode.InvalidPart
        await store.abort_upload(upload)
        assert await code_of(store.get_upload("attempts2", "k", upload.upload_id)) == ErrorCode.NoSuchUpload
        assert await store.list_uploads("attempts2") == []
        assert await _leftovers(store, "attempts2", upload.upload_id) == []

    opened(scenario)
