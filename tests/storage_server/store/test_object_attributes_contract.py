"""The object-store contract for what S3 keeps beside an object's bytes: tags, canned ACLs, part sizes, bucket tags and ACLs.

Run against every backend (the s3 one keeps them at the upstream, where every node reads them).
"""

from __future__ import annotations

from storesupport import body, code_of, read_with_meta

from protocol.errors import ErrorCode
from storage_server.store import PutSpec

BIG = 5 * 1024 * 1024  # the smallest part size that may be followed by another part


def test_object_tags_are_set_replaced_and_removed_and_reach_copies(opened):
    async def scenario(store, _):
        await store.create_bucket("bkt", "alice", "us-east-1")
        put = await store.put_object("bkt", "t", body(b"tagged"), PutSpec(tags={"team": "kv", "tier": "hot"}), "alice")
        assert (await store.head_object("bkt", "t")).tags == {"team": "kv", "tier": "hot"}
        await store.set_object_tags("bkt", "t", {"tier": "cold"})
        data, meta = await read_with_meta(store, "bkt", "t")
        assert data == b"tagged" and meta.tags == {"tier": "cold"} and meta.etag == put.etag  # bytes and version untouched
        await store.copy_object(meta, "bkt", "copy", PutSpec(tags=meta.tags), "alice")
        assert (await store.head_object("bkt", "copy")).tags == {"tier": "cold"}
        await store.set_object_tags("bkt", "t", {})
        assert (await store.head_object("bkt", "t")).tags == {}
        await store.put_object("bkt", "plain", body(b"x"), PutSpec(), "alice")
        assert (await store.head_object("bkt", "plain")).tags == {}
        assert await code_of(store.set_object_tags("bkt", "missing", {"a": "b"})) == ErrorCode.NoSuchKey

    opened(scenario)


def test_an_object_acl_is_kept_changed_and_leaves_everything_else_as_it_was(opened):
    async def scenario(store, _):
        await store.create_bucket("bkt", "alice", "us-east-1")
        spec = PutSpec(content_type="text/plain", user_metadata={"who": "me"}, tags={"t": "1"}, acl="public-read")
        await store.put_object("bkt", "doc", body(b"readable"), spec, "alice")
        assert (await store.head_object("bkt", "doc")).acl == "public-read"
        await store.set_object_acl("bkt", "doc", "private")
        data, meta = await read_with_meta(store, "bkt", "doc")
        assert data == b"readable" and meta.acl == "private"
        assert (meta.content_type, meta.user_metadata, meta.tags, meta.owner) == ("text/plain", {"who": "me"}, {"t": "1"}, "alice")
        await store.set_object_acl("bkt", "doc", "public-read")
        assert (await store.head_object("bkt", "doc")).acl == "public-read"
        # A KV chunk stays immutable through an ACL change.
        await store.put_object("bkt", "chunk", body(b"kv bytes"), PutSpec(immutable=True), "alice")
        await store.set_object_acl("bkt", "chunk", "public-read")
        assert await code_of(store.put_object("bkt", "chunk", body(b"changed!"), PutSpec(), "alice")) == ErrorCode.InvalidRequest
        assert (await read_with_meta(store, "bkt", "chunk"))[0] == b"kv bytes"
        assert await code_of(store.set_object_acl("bkt", "missing", "private")) == ErrorCode.NoSuchKey

    opened(scenario)


def test_a_multipart_objects_part_sizes_are_known_to_head_get_and_copies(opened):
    async def scenario(store, _):
        await store.create_bucket("bkt", "alice", "us-east-1")
        upload = await store.create_upload("bkt", "mp", PutSpec(), "alice")
        p1 = await store.upload_part(upload, 1, body(b"a" * BIG), PutSpec())
        p2 = await store.upload_part(upload, 2, body(b"tail"), PutSpec())
        done = await store.complete_upload(upload, [(1, p1.etag, {}), (2, p2.etag, {})])
        assert (await store.head_object("bkt", "mp")).part_sizes == (BIG, 4)
        data, meta = await read_with_meta(store, "bkt", "mp")
        assert len(data) == BIG + 4 and meta.part_sizes == (BIG, 4) and meta.etag == done.etag
        await store.set_object_acl("bkt", "mp", "public-read")  # may rewrite the object: its parts stay known
        assert (await store.head_object("bkt", "mp")).part_sizes == (BIG, 4)
        await store.copy_object(await store.head_object("bkt", "mp"), "bkt", "mp-copy", PutSpec(), "alice")
        assert (await store.head_object("bkt", "mp-copy")).part_sizes == (BIG, 4)
        await store.put_object("bkt", "mp", body(b"whole"), PutSpec(), "alice")  # replaced by an object put whole: one part
        assert (await store.head_object("bkt", "mp")).part_sizes == ()

    opened(scenario)


def test_bucket_tags_and_acl_are_kept(opened):
    async def scenario(store, _):
        await store.create_bucket("bkt", "alice", "us-east-1")
        assert (await store.get_bucket("bkt")).tags == {}
        await store.set_bucket_tags("bkt", {"owner": "kv-team"})
        await store.set_bucket_acl("bkt", "public-read")
        info = await store.get_bucket("bkt")
        assert (info.tags, info.acl, info.owner) == ({"owner": "kv-team"}, "public-read", "alice")
        await store.set_bucket_tags("bkt", {})
        await store.set_bucket_acl("bkt", "private")
        info = await store.get_bucket("bkt")
        assert (info.tags, info.acl) == ({}, "private")
        assert await code_of(store.set_bucket_tags("nope", {"a": "b"})) == ErrorCode.NoSuchBucket

    opened(scenario)
