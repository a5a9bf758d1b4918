"""Bucket operations through boto3 against a real gateway."""

from __future__ import annotations

import uuid

import pytest
from botocore.exceptions import ClientError


def error_code(exc: pytest.ExceptionInfo) -> str:
    return exc.value.response["Error"]["Code"]


def new_name() -> str:
    return f"bk-{uuid.uuid4().hex[:16]}"


def test_create_head_delete_bucket(s3):
    name = new_name()
    s3.create_bucket(Bucket=name)
    head = s3.head_bucket(Bucket=name)
    assert head["ResponseMetadata"]["HTTPHeaders"]["x-amz-bucket-region"] == "us-east-1"
    assert name in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    s3.delete_bucket(Bucket=name)
    with pytest.raises(ClientError) as e:
        s3.head_bucket(Bucket=name)
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


@pytest.mark.parametrize("name", ["ab", "UPPER", "has_underscore", "-start", "end-", "a..b", "192.168.1.1", "x" * 64, "xn--punycode"])
def test_invalid_bucket_names_are_refused(s3, name):
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket=name)
    assert error_code(e) == "InvalidBucketName"


def test_create_existing_bucket(s3, s3_bob, bucket):
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket=bucket)
    assert error_code(e) == "BucketAlreadyOwnedByYou"
    with pytest.raises(ClientError) as e:
        s3_bob.create_bucket(Bucket=bucket)
    assert error_code(e) == "BucketAlreadyExists"


def test_location_constraint(s3):
    name = new_name()
    s3.create_bucket(Bucket=name)
    assert s3.get_bucket_location(Bucket=name)["LocationConstraint"] is None  # us-east-1 reads as empty
    s3.delete_bucket(Bucket=name)
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket=new_name(), CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    assert error_code(e) == "InvalidLocationConstraint"


def test_delete_non_empty_bucket(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    with pytest.raises(ClientError) as e:
        s3.delete_bucket(Bucket=bucket)
    assert error_code(e) == "BucketNotEmpty"


def test_delete_missing_bucket(s3):
    with pytest.raises(ClientError) as e:
        s3.delete_bucket(Bucket=new_name())
    assert error_code(e) == "NoSuchBucket"


def test_list_buckets_paginates_and_shows_only_own(s3, s3_bob):
    prefix = f"pg{uuid.uuid4().hex[:8]}-"
    names = sorted(f"{prefix}{i:02d}" for i in range(7))
    for n in names:
        s3.create_bucket(Bucket=n)
    try:
        seen, token, pages = [], None, 0
        while True:
            kw = {"MaxBuckets": 3, "Prefix": prefix}
            if token:
                kw["ContinuationToken"] = token
            r = s3.list_buckets(**kw)
            seen += [b["Name"] for b in r["Buckets"]]
            pages += 1
            token = r.get("ContinuationToken")
            if not token:
                break
        assert seen == names and pages == 3
        assert not [b for b in s3_bob.list_buckets()["Buckets"] if b["Name"].startswith(prefix)]
    finally:
        for n in names:
            s3.delete_bucket(Bucket=n)


def test_other_tenant_gets_access_denied(s3, s3_bob, bucket):
    s3.put_object(Bucket=bucket, Key="secret", Body=b"alice's")
    calls = [
        lambda: s3_bob.head_bucket(Bucket=bucket),
        lambda: s3_bob.list_objects_v2(Bucket=bucket),
        lambda: s3_bob.get_object(Bucket=bucket, Key="secret"),
        lambda: s3_bob.put_object(Bucket=bucket, Key="x", Body=b"bob's"),
        lambda: s3_bob.delete_object(Bucket=bucket, Key="secret"),
        lambda: s3_bob.delete_bucket(Bucket=bucket),
        lambda: s3_bob.get_bucket_location(Bucket=bucket),
        lambda: s3_bob.create_multipart_upload(Bucket=bucket, Key="m"),
    ]
    for call in calls:
        with pytest.raises(ClientError) as e:
            call()
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert s3.get_object(Bucket=bucket, Key="secret")["Body"].read() == b"alice's"
