"""Bucket operations through boto3 against a real gateway."""

from __future__ import annotations

import uuid
import xml.etree.ElementTree as ET

import pytest
from botocore.exceptions import ClientError
from inprocess import InProcessNode
from rawhttp import signed
from support import boto_client, write_config


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


@pytest.mark.parametrize("name,why", [
    ("ab", "3 to 63 characters long"),
    ("x" * 64, "3 to 63 characters long"),
    ("UPPER", "only lowercase letters a-z, digits 0-9, '.' and '-' are allowed"),
    ("has_underscore", "contains '_'"),
    ("-start", "begin and end with a lowercase letter or a digit"),
    ("end-", "begin and end with a lowercase letter or a digit"),
    ("a..b", "two adjacent periods"),
    ("192.168.1.1", "IP address"),
    ("xn--punycode", "prefix 'xn--' is reserved"),
    ("sthree-bucket", "prefix 'sthree-' is reserved"),
    ("name-s3alias", "suffix '-s3alias' is reserved"),
    ("name--ol-s3", "suffix '--ol-s3' is reserved"),
])
def test_invalid_bucket_names_are_refused_saying_why(s3, name, why):
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket=name)
    assert error_code(e) == "InvalidBucketName"
    assert why in e.value.response["Error"]["Message"]


def test_recreating_your_own_bucket_in_us_east_1_succeeds(s3, s3_bob, bucket):
    """S3's legacy us-east-1 behaviour: CreateBucket on a bucket you own answers 200 and changes nothing."""
    s3.put_object(Bucket=bucket, Key="kept", Body=b"still here")
    r = s3.create_bucket(Bucket=bucket)
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert s3.get_object(Bucket=bucket, Key="kept")["Body"].read() == b"still here"
    with pytest.raises(ClientError) as e:
        s3_bob.create_bucket(Bucket=bucket)
    assert error_code(e) == "BucketAlreadyExists"


def test_location_constraint(s3):
    name = new_name()
    s3.create_bucket(Bucket=name)
    assert s3.get_bucket_location(Bucket=name)["LocationConstraint"] is None  # us-east-1 reads as empty
    s3.delete_bucket(Bucket=name)
    s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "us-east-1"})  # the gateway's own region
    assert s3.get_bucket_location(Bucket=name)["LocationConstraint"] is None
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


@pytest.fixture(scope="module")
def regional(tmp_path_factory, tenants):
    """A node whose gateway serves eu-west-1, and alice's client for it."""
    root = tmp_path_factory.mktemp("eu-west-1")
    config = write_config(root / "objectcache.toml", root / "data", list(tenants.values()),
                          extra=f'\n[gateway]\nregion = "eu-west-1"\n\n[storage_server]\nsocket = "{root / "ss.sock"}"\n')
    node = InProcessNode(config).start()
    yield boto_client(node.endpoint, tenants["alice"])
    node.stop()


def test_bucket_in_another_region(regional):
    """Outside us-east-1, re-creating your own bucket is 409 BucketAlreadyOwnedByYou, and the location is the region."""
    name = new_name()
    regional.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    assert regional.get_bucket_location(Bucket=name)["LocationConstraint"] == "eu-west-1"
    assert regional.head_bucket(Bucket=name)["ResponseMetadata"]["HTTPHeaders"]["x-amz-bucket-region"] == "eu-west-1"
    with pytest.raises(ClientError) as e:
        regional.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    assert error_code(e) == "BucketAlreadyOwnedByYou" and e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 409
    with pytest.raises(ClientError) as e:
        regional.create_bucket(Bucket=name)  # no constraint: the gateway's region
    assert error_code(e) == "BucketAlreadyOwnedByYou"
    with pytest.raises(ClientError) as e:
        regional.create_bucket(Bucket=new_name(), CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    assert error_code(e) == "InvalidLocationConstraint"
    regional.delete_bucket(Bucket=name)


# --- versioning: buckets are never versioned ---------------------------------------


def test_get_bucket_versioning_of_an_unversioned_bucket(server, tenants, s3, bucket):
    """An empty VersioningConfiguration (no Status), as S3 answers for a bucket never versioned."""
    r = s3.get_bucket_versioning(Bucket=bucket)
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert "Status" not in r and "MFADelete" not in r
    raw = signed(server.endpoint, tenants["alice"], "GET", f"/{bucket}?versioning")
    doc = ET.fromstring(raw.body)
    assert raw.status == 200 and doc.tag == "{http://s3.amazonaws.com/doc/2006-03-01/}VersioningConfiguration" and len(doc) == 0


def test_bucket_versioning_is_the_owners(s3_bob, bucket):
    with pytest.raises(ClientError) as e:
        s3_bob.get_bucket_versioning(Bucket=bucket)
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    with pytest.raises(ClientError) as e:
        s3_bob.get_bucket_versioning(Bucket=new_name())
    assert error_code(e) == "NoSuchBucket"


@pytest.mark.parametrize("status", ["Enabled", "Suspended"])
def test_put_bucket_versioning_is_not_implemented(s3, bucket, status):
    with pytest.raises(ClientError) as e:
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": status})
    assert error_code(e) == "NotImplemented" and e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 501
    assert "versioning is not supported" in e.value.response["Error"]["Message"]
    assert "Status" not in s3.get_bucket_versioning(Bucket=bucket)


def test_other_unsupported_sub_resources_stay_501(server, tenants, s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.get_bucket_cors(Bucket=bucket)
    assert error_code(e) == "NotImplemented"
    r = signed(server.endpoint, tenants["alice"], "DELETE", f"/{bucket}?versioning")  # not DeleteBucket
    assert r.status == 501 and b"<Code>NotImplemented</Code>" in r.body
    s3.head_bucket(Bucket=bucket)
