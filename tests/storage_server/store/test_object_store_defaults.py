"""A backend that implements only the mandatory core: batches fall back to it, the rest answers NotImplemented."""

from __future__ import annotations

import asyncio

import pytest

from protocol.errors import ErrorCode, S3Error
from storage_server.store import ByteRange, ObjectMeta, ObjectStore, PutSpec, UploadInfo


class CoreOnly(ObjectStore):
    """Objects in a dict; buckets and listing are never reached by these tests."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    async def put_object(self, bucket, key, body, spec, owner):
        self.objects[key] = b"".join([p async for p in body])
        return ObjectMeta(bucket, key, len(self.objects[key]), '"etag"', 0.0)

    async def delete_object(self, bucket, key):
        self.objects.pop(key, None)

    async def _unused(self, *args, **kwargs):
        raise AssertionError("not part of this test")

    create_bucket = get_bucket = delete_bucket = list_buckets = head_object = open_object = list_objects = _unused


def test_batches_fall_back_to_the_core_operations():
    async def scenario(store: CoreOnly) -> None:
        metas = await store.put_many("b", [("a", b"1", PutSpec()), ("b", b"22", PutSpec())], "o")
        assert [(m.key, m.size) for m in metas] == [("a", 1), ("b", 2)] and store.objects == {"a": b"1", "b": b"22"}
        await store.delete_many("b", ["a", "missing"])
        assert store.objects == {"b": b"22"}
        assert await store.reclaim_orphans() == 0

    asyncio.run(scenario(CoreOnly()))


UPLOAD = UploadInfo("id", "b", "k", 0.0, "o", PutSpec())
SRC = ObjectMeta("b", "src", 1, '"e"', 0.0)


@pytest.mark.parametrize("operation, call", [
    ("CopyObject", lambda s: s.copy_object(SRC, "b", "k", PutSpec(), "o")),
    ("CreateMultipartUpload", lambda s: s.create_upload("b", "k", PutSpec(), "o")),
    ("Multipart upload", lambda s: s.get_upload("b", "k", "id")),
    ("UploadPart", lambda s: s.upload_part(UPLOAD, 1, None, PutSpec())),
    ("UploadPartCopy", lambda s: s.upload_part_copy(UPLOAD, 1, SRC, ByteRange(0, 1))),
    ("ListParts", lambda s: s.list_parts(UPLOAD)),
    ("CompleteMultipartUpload", lambda s: s.complete_upload(UPLOAD, [(1, '"e"', {})])),
    ("AbortMultipartUpload", lambda s: s.abort_upload(UPLOAD)),
    ("ListMultipartUploads", lambda s: s.list_uploads("b")),
])
def test_optional_operations_answer_not_implemented_naming_the_operation_and_the_store(operation, call):
    with pytest.raises(S3Error) as e:
        asyncio.run(call(CoreOnly()))
    assert (e.value.code, e.value.status) == (ErrorCode.NotImplemented, 501)
    assert e.value.message == f"{operation} is not supported by the CoreOnly store."
