"""The MinIO Python SDK on ObjectCache: compose_object (UploadPartCopy ranges into one object), presigned GET and PUT
URLs used by plain HTTP, remove_objects (DeleteObjects in batches), and the bucket policy / notification
questions it asks (404 NoSuchBucketPolicy, an empty configuration)."""

from __future__ import annotations

import io
import os
import urllib.request
from datetime import timedelta

import pytest

minio = pytest.importorskip("minio", reason="minio is in the clients extra (make test installs it)")
from minio.commonconfig import ComposeSource  # noqa: E402
from minio.deleteobjects import DeleteObject  # noqa: E402
from minio.error import S3Error as MinioError  # noqa: E402

MiB = 1024 * 1024


@pytest.fixture
def mc(server, tenants):
    t = tenants["alice"]
    return minio.Minio(server.endpoint.removeprefix("http://"), access_key=t.access_key, secret_key=t.secret_key, secure=False, region="us-east-1")


def test_compose_object_from_ranges(mc, bucket):
    a, b = os.urandom(6 * MiB), os.urandom(2 * MiB)
    mc.put_object(bucket, "a.bin", io.BytesIO(a), len(a))
    mc.put_object(bucket, "b.bin", io.BytesIO(b), len(b))
    mc.compose_object(bucket, "joined.bin", [ComposeSource(bucket, "a.bin"), ComposeSource(bucket, "b.bin", offset=1000, length=5000)])
    resp = mc.get_object(bucket, "joined.bin")
    try:
        assert resp.read() == a + b[1000:6000]
    finally:
        resp.close()
        resp.release_conn()
    assert mc.stat_object(bucket, "joined.bin").etag.endswith("-2")  # one part per source


def test_presigned_urls_work_for_plain_http(mc, bucket):
    put_url = mc.presigned_put_object(bucket, "up.txt", expires=timedelta(minutes=5))
    with urllib.request.urlopen(urllib.request.Request(put_url, data=b"uploaded with a presigned URL", method="PUT"), timeout=30) as r:
        assert r.status == 200
    get_url = mc.presigned_get_object(bucket, "up.txt", expires=timedelta(minutes=5))
    with urllib.request.urlopen(get_url, timeout=30) as r:
        assert r.read() == b"uploaded with a presigned URL"


def test_remove_objects_in_bulk(mc, bucket):
    for i in range(30):
        mc.put_object(bucket, f"logs/{i:03d}", io.BytesIO(b"x"), 1)
    errors = list(mc.remove_objects(bucket, [DeleteObject(f"logs/{i:03d}") for i in range(25)]))
    assert errors == []
    assert [o.object_name for o in mc.list_objects(bucket, prefix="logs/", recursive=True)] == [f"logs/{i:03d}" for i in range(25, 30)]


def test_policy_and_notification_questions(mc, bucket):
    with pytest.raises(MinioError) as e:
        mc.get_bucket_policy(bucket)
    assert e.value.code == "NoSuchBucketPolicy"
    config = mc.get_bucket_notification(bucket)
    assert not (config.cloud_func_config_list or config.queue_config_list or config.topic_config_list)
