"""The object-store contract: what every backend does for the S3 operations, specified once.

Bucket names are ones the gateway accepts (3..63 characters): an upstream S3 store refuses others.
"""

from __future__ import annotations

from storesupport import body, code_of, read_all

from protocol.errors import ErrorCode
from storage_server.store import ByteRange, PutSpec

SPEC = PutSpec()
BIG = 5 * 1024 * 1024  # the smallest part size that may be followed by another part


def test_buckets_belong_to_their_creator_and_must_be_empty_to_go(opened):
    async def scenario(store, _):
        await store.create_bucket("bkt1", "alice", "us-east-1")
        assert await code_of(store.create_bucket("bkt1", "alice", "us-east-1")) == ErrorCode.BucketAlreadyOwnedByYou
        assert await code_of(store.create_bucket("bkt1", "bob", "us-east-1")) == ErrorCode.BucketAlreadyExists
        info = await store.get_bucket("bkt1")
        assert (info.name, info.owner, info.region) == ("bkt1", "alice", "us-east-1")
        await store.create_bucket("bkt2", "alice", "us-east-1")
        await store.create_bucket("ckt1", "bob", "us-east-1")
        assert [b.name for b in await store.list_buckets("alice")] == ["bkt1", "bkt2"]
        assert [b.name for b in await store.list_buckets("alice", after="bkt1")] == ["bkt2"]
        await store.put_object("bkt1", "k", body(b"x"), SPEC, "alice")
        assert await code_of(store.delete_bucket("bkt1")) == ErrorCode.BucketNotEmpty
        await store.delete_object("bkt1", "k")
        await store.delete_bucket("bkt1")
        assert await code_of(store.get_bucket("bkt1")) == ErrorCode.NoSuchBucket
        assert await code_of(store.delete_bucket("nope")) == ErrorCode.NoSuchBucket

    opened(scenario)


def test_objects_round_trip_with_metadata_ranges_and_overwrite(opened):
    async def scenario(store, _):
        await store.create_bucket("bkt", "alice", "us-east-1")
        spec = PutSpec(content_type="text/plain", user_metadata={"who": "me"}, checksum_algorithms=("CRC32C",))
        meta = await store.put_object("bkt", "k", body(b"hello ", b"world"), spec, "alice")
        assert meta.size == 11 and meta.etag == '"5eb63bbbe01eeed093cb22bb8f5acdc3"' and "CRC32C" in meta.checksums
        head = await store.head_object("bkt", "k")
        assert (head.size, head.etag, head.content_type, head.user_metadata, head.owner) == (11, meta.etag, "text/plain", {"who": "me"}, "alice")
        assert await read_all(store, "bkt", "k") == b"hello world"
        assert await read_all(store, "bkt", "k", ByteRange(6, 11)) == b"world"
        await store.put_object("bkt", "k", body(b"second"), SPEC, "alice")
        assert await read_all(store, "bkt", "k") == b"second"
        await store.delete_object("bkt", "k")
        assert await code_of(store.head_object("bkt", "k")) == ErrorCode.NoSuchKey
        await store.delete_object("bkt", "k")  # deleting what is gone is fine
        assert await code_of(store.put_object("nope", "k", body(b"x"), SPEC, "alice")) == ErrorCode.NoSuchBucket

    opened(scenario)


def test_a_declared_digest_that_does_not_match_stores_nothing(opened):
    async def scenario(store, _):
        await store.create_bucket("bkt", "alice", "us-east-1")
        bad = PutSpec(expected_md5=b"\0" * 16)
        assert await code_of(store.put_object("bkt", "k", body(b"data"), bad, "alice")) == ErrorCode.BadDigest
        assert await code_of(store.put_object("bkt", "k", body(b"data"), PutSpec(expected_size=5), "alice")) == ErrorCode.IncompleteBody
        assert await code_of(store.head_object("bkt", "k")) == ErrorCode.NoSuchKey

    opened(scenario)


def test_listing_is_utf8_ordered_grouped_and_paginated(opened):
    async def scenario(store, _):
        await store.create_bucket("bkt", "alice", "us-east-1")
        keys = ["a/1", "a/2", "b", "c/x/1", "c/y", "z", "é"]  # UTF-8 byte order: "é" (0xC3…) after "z"
        for k in reversed(keys):
            await store.put_object("bkt", k, body(k.encode()), SPEC, "alice")
        page = await store.list_objects("bkt")
        assert [o.key for o in page.objects] == keys and not page.is_truncated
        page = await store.list_objects("bkt", delimiter="/")
        assert [o.key for o in page.objects] == ["b", "z", "é"] and page.common_prefixes == ["a/", "c/"]
        page = await store.list_objects("bkt", prefix="c/", delimiter="/")
        assert [o.key for o in page.objects] == ["c/y"] and page.common_prefixes == ["c/x/"]
        first = await store.list_objects("bkt", limit=3)
        assert [o.key for o in first.objects] == keys[:3] and first.is_truncated and first.next_marker == "b"
        rest = await store.list_objects("bkt", after=first.next_marker, limit=10)
        assert [o.key for o in rest.objects] == keys[3:]
        grouped = await store.list_objects("bkt", delimiter="/", limit=1)
        assert grouped.common_prefixes == ["a/"] and grouped.is_truncated
        after = await store.list_objects("bkt", delimiter="/", after=grouped.next_marker, limit=1)
        assert [o.key for o in after.objects] == ["b"]

    opened(scenario)


def test_delete_many_and_copy(opened):
    async def scenario(store, _):
        await store.create_bucket("bkt", "alice", "us-east-1")
        src = await store.put_object("bkt", "src", body(b"copied bytes"), SPEC, "alice")
        copy = await store.copy_object(src, "bkt", "dst", PutSpec(content_type="x/y"), "alice")
        assert copy.etag == src.etag and await read_all(store, "bkt", "dst") == b"copied bytes"
        assert (await store.head_object("bkt", "dst")).content_type == "x/y"
        await store.delete_many("bkt", ["src", "dst", "never-was"])
        assert (await store.list_objects("bkt")).objects == []

    opened(scenario)


def test_multipart_upload_lifecycle(opened):
    async def scenario(store, _):
        await store.create_bucket("bkt", "alice", "us-east-1")
        upload = await store.create_upload("bkt", "big", PutSpec(content_type="app/x"), "alice")
        assert (await store.get_upload("bkt", "big", upload.upload_id)).upload_id == upload.upload_id
        p1 = await store.upload_part(upload, 1, body(b"a" * BIG), PutSpec())
        p2 = await store.upload_part(upload, 2, body(b"stale"), PutSpec())
        p2 = await store.upload_part(upload, 2, body(b"tail"), PutSpec())  # a re-sent part replaces the earlier one
        assert [p.part_number for p in await store.list_parts(upload)] == [1, 2]
        assert await code_of(store.complete_upload(upload, [(2, p2.etag, {}), (1, p1.etag, {})])) == ErrorCode.InvalidPartOrder
        assert await code_of(store.complete_upload(upload, [(1, p1.etag, {}), (2, '"0000"', {})])) == ErrorCode.InvalidPart
        meta = await store.complete_upload(upload, [(1, p1.etag, {}), (2, p2.etag, {})])
        assert meta.size == BIG + 4 and meta.etag.endswith('-2"') and meta.part_sizes == (BIG, 4)
        assert (await read_all(store, "bkt", "big", ByteRange(BIG - 1, BIG + 4))) == b"atail"
        assert await code_of(store.get_upload("bkt", "big", upload.upload_id)) == ErrorCode.NoSuchUpload

    opened(scenario)


def test_small_parts_before_the_last_are_refused(opened):
    async def scenario(store, _):
        await store.create_bucket("bkt", "alice", "us-east-1")
        upload = await store.create_upload("bkt", "k", SPEC, "alice")
        p1 = await store.upload_part(upload, 1, body(b"small"), PutSpec())
        p2 = await store.upload_part(upload, 2, body(b"last"), PutSpec())
        assert await code_of(store.complete_upload(upload, [(1, p1.etag, {}), (2, p2.etag, {})])) == ErrorCode.EntityTooSmall
        await store.abort_upload(upload)
        assert await code_of(store.get_upload("bkt", "k", upload.upload_id)) == ErrorCode.NoSuchUpload

    opened(scenario)


def test_uploads_are_listed_in_key_order_and_grouped_by_delimiter(opened):
    async def scenario(store, _):
        await store.create_bucket("bkt", "alice", "us-east-1")
        for key in ["logs/2", "logs/1", "a", "z/1"]:
            await store.create_upload("bkt", key, SPEC, "alice")
        assert [u.key for u in await store.list_uploads("bkt")] == ["a", "logs/1", "logs/2", "z/1"]
        page = await store.list_uploads_page("bkt", "", "/", "", "", 1000)
        assert [u.key for u in page.uploads] == ["a"] and page.common_prefixes == ["logs/", "z/"] and not page.is_truncated
        page = await store.list_uploads_page("bkt", "logs/", "/", "", "", 1)
        assert [u.key for u in page.uploads] == ["logs/1"] and page.is_truncated and page.next_key_marker == "logs/1"

    opened(scenario)


def test_an_immutable_object_accepts_only_an_identical_re_put(opened):
    async def scenario(store, _):
        await store.create_bucket("bkt", "alice", "us-east-1")
        chunk = PutSpec(immutable=True)
        first = await store.put_object("bkt", "chunk", body(b"kv bytes"), chunk, "alice")
        again = await store.put_object("bkt", "chunk", body(b"kv bytes"), chunk, "alice")
        assert again.etag == first.etag
        assert await code_of(store.put_object("bkt", "chunk", body(b"other!!!"), chunk, "alice")) == ErrorCode.InvalidRequest
        assert await code_of(store.put_object("bkt", "chunk", body(b"other!!!"), SPEC, "alice")) == ErrorCode.InvalidRequest
        assert await read_all(store, "bkt", "chunk") == b"kv bytes"

    opened(scenario)


def test_paging_through_grouped_uploads_returns_each_prefix_once_and_ends(opened):
    async def scenario(store, _):
        await store.create_bucket("bkt", "alice", "us-east-1")
        for key in ["a", "logs/1", "logs/2", "logs/3"]:
            await store.create_upload("bkt", key, SPEC, "alice")
        first = await store.list_uploads_page("bkt", "", "/", "", "", 2)
        assert [u.key for u in first.uploads] == ["a"] and first.common_prefixes == ["logs/"]
        assert not first.is_truncated  # the uploads left all roll up into "logs/", already on this page
        one = await store.list_uploads_page("bkt", "", "/", "", "", 1)
        assert one.is_truncated and one.next_key_marker == "a"
        rest = await store.list_uploads_page("bkt", "", "/", one.next_key_marker, one.next_upload_id_marker or "", 1)
        assert rest.uploads == [] and rest.common_prefixes == ["logs/"] and not rest.is_truncated
        after_prefix = await store.list_uploads_page("bkt", "", "/", "logs/", "", 10)
        assert after_prefix.uploads == [] and after_prefix.common_prefixes == [] and not after_prefix.is_truncated

    opened(scenario)


def test_no_upload_or_self_copy_turns_an_immutable_chunk_into_other_bytes(opened):
    async def scenario(store, _):
        await store.create_bucket("bkt", "alice", "us-east-1")
        src = await store.put_object("bkt", "chunk", body(b"kv bytes"), PutSpec(immutable=True), "alice")
        upload = await store.create_upload("bkt", "chunk", SPEC, "alice")
        part = await store.upload_part(upload, 1, body(b"other bytes"), PutSpec())
        assert await code_of(store.complete_upload(upload, [(1, part.etag, {})])) == ErrorCode.InvalidRequest
        await store.copy_object(src, "bkt", "chunk", PutSpec(content_type="x/y"), "alice")  # new metadata, same bytes
        other = await store.put_object("bkt", "other", body(b"other bytes"), SPEC, "alice")
        assert await code_of(store.copy_object(other, "bkt", "chunk", SPEC, "alice")) == ErrorCode.InvalidRequest
        assert await code_of(store.put_object("bkt", "chunk", body(b"changed!"), SPEC, "alice")) == ErrorCode.InvalidRequest
        assert await read_all(store, "bkt", "chunk") == b"kv bytes"

    opened(scenario)


def test_of_two_uploads_of_one_part_number_the_one_started_last_counts(opened):
    """A client re-sends part 1; the first attempt finishes after the second: the second is the part."""
    import asyncio

    async def scenario(store, _):
        await store.create_bucket("bkt", "alice", "us-east-1")
        upload = await store.create_upload("bkt", "k", SPEC, "alice")
        release = asyncio.Event()

        async def slow_body():
            await release.wait()
            yield b"first attempt"

        first = asyncio.ensure_future(store.upload_part(upload, 1, slow_body(), PutSpec()))
        await asyncio.sleep(0.05)
        second = await store.upload_part(upload, 1, body(b"second attempt"), PutSpec())
        release.set()
        await first
        assert [p.etag for p in await store.list_parts(upload)] == [second.etag]
        meta = await store.complete_upload(upload, [(1, second.etag, {})])
        assert await read_all(store, "bkt", "k") == b"second attempt" and meta.size == len(b"second attempt")

    opened(scenario)
