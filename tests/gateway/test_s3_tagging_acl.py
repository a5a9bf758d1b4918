"""Tagging and canned ACLs as common tools use them (boto3, and plain unsigned HTTP for public reads)."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from botocore.exceptions import ClientError


def code(e: pytest.ExceptionInfo) -> str:
    return e.value.response["Error"]["Code"]


def test_object_tags_on_put_get_put_and_delete(s3, bucket):
    s3.put_object(Bucket=bucket, Key="t", Body=b"x", Tagging="team=kv&tier=hot")
    assert s3.head_object(Bucket=bucket, Key="t")["ResponseMetadata"]["HTTPHeaders"]["x-amz-tagging-count"] == "2"
    assert s3.get_object(Bucket=bucket, Key="t")["TagCount"] == 2
    assert {t["Key"]: t["Value"] for t in s3.get_object_tagging(Bucket=bucket, Key="t")["TagSet"]} == {"team": "kv", "tier": "hot"}
    s3.put_object_tagging(Bucket=bucket, Key="t", Tagging={"TagSet": [{"Key": "tier", "Value": "cold"}]})
    assert s3.get_object_tagging(Bucket=bucket, Key="t")["TagSet"] == [{"Key": "tier", "Value": "cold"}]
    s3.delete_object_tagging(Bucket=bucket, Key="t")
    assert s3.get_object_tagging(Bucket=bucket, Key="t")["TagSet"] == []
    assert s3.get_object(Bucket=bucket, Key="t")["Body"].read() == b"x"  # bytes untouched


def test_tags_reach_objects_made_by_multipart_and_copy(s3, bucket):
    upload = s3.create_multipart_upload(Bucket=bucket, Key="mp", Tagging="made=multipart")["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key="mp", UploadId=upload, PartNumber=1, Body=b"p")["ETag"]
    s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=upload, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert s3.get_object_tagging(Bucket=bucket, Key="mp")["TagSet"] == [{"Key": "made", "Value": "multipart"}]
    s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "mp"})
    assert s3.get_object_tagging(Bucket=bucket, Key="copy")["TagSet"] == [{"Key": "made", "Value": "multipart"}]


def test_invalid_tags_are_refused(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="bad", Body=b"x", Tagging="&".join(f"k{i}=v" for i in range(11)))
    assert code(e) == "InvalidTag"
    s3.put_object(Bucket=bucket, Key="ok", Body=b"x")
    with pytest.raises(ClientError) as e:
        s3.put_object_tagging(Bucket=bucket, Key="ok", Tagging={"TagSet": [{"Key": "aws:x", "Value": "v"}]})
    assert code(e) == "InvalidTag"
    with pytest.raises(ClientError) as e:
        s3.get_object_tagging(Bucket=bucket, Key="missing")
    assert code(e) == "NoSuchKey"


def test_bucket_tags(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.get_bucket_tagging(Bucket=bucket)
    assert code(e) == "NoSuchTagSet"
    s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": [{"Key": "owner", "Value": "kv-team"}]})
    assert s3.get_bucket_tagging(Bucket=bucket)["TagSet"] == [{"Key": "owner", "Value": "kv-team"}]
    s3.delete_bucket_tagging(Bucket=bucket)
    with pytest.raises(ClientError):
        s3.get_bucket_tagging(Bucket=bucket)


def test_acls_report_the_owners_full_control(s3, bucket, tenants):
    s3.put_object(Bucket=bucket, Key="a", Body=b"x")
    for acl in (s3.get_object_acl(Bucket=bucket, Key="a"), s3.get_bucket_acl(Bucket=bucket)):
        assert acl["Owner"]["ID"] == "alice"
        assert [(g["Grantee"].get("ID"), g["Permission"]) for g in acl["Grants"]] == [("alice", "FULL_CONTROL")]


def anonymous_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_public_read_really_allows_anonymous_reads_of_that_object_only(server, s3, s3_bob, bucket):
    s3.put_object(Bucket=bucket, Key="public", Body=b"for everyone", ACL="public-read")
    s3.put_object(Bucket=bucket, Key="private", Body=b"mine")
    assert anonymous_get(f"{server.endpoint}/{bucket}/public") == (200, b"for everyone")
    assert s3_bob.get_object(Bucket=bucket, Key="public")["Body"].read() == b"for everyone"  # another tenant, too
    for key in ("private", "missing"):  # a missing key does not reveal itself
        status, body = anonymous_get(f"{server.endpoint}/{bucket}/{key}")
        assert status == 403 and b"AccessDenied" in body
    assert anonymous_get(f"{server.endpoint}/{bucket}")[0] == 403  # listing stays private
    grants = s3.get_object_acl(Bucket=bucket, Key="public")["Grants"]
    assert ("http://acs.amazonaws.com/groups/global/AllUsers", "READ") in [(g["Grantee"].get("URI"), g["Permission"]) for g in grants]
    s3.put_object_acl(Bucket=bucket, Key="public", ACL="private")
    assert anonymous_get(f"{server.endpoint}/{bucket}/public")[0] == 403
    with pytest.raises(ClientError) as e:
        s3_bob.get_object(Bucket=bucket, Key="public")
    assert code(e) == "AccessDenied"


def test_canned_acls_on_buckets_and_grant_lists_answer_not_implemented(s3, bucket):
    s3.put_bucket_acl(Bucket=bucket, ACL="public-read")
    grants = s3.get_bucket_acl(Bucket=bucket)["Grants"]
    assert [g["Permission"] for g in grants] == ["FULL_CONTROL", "READ"]
    with pytest.raises(ClientError) as e:
        s3.put_bucket_acl(Bucket=bucket, ACL="no-such-acl")
    assert code(e) == "InvalidArgument"
    with pytest.raises(ClientError) as e:
        s3.put_bucket_acl(Bucket=bucket, GrantRead='uri="http://acs.amazonaws.com/groups/global/AllUsers"')
    assert code(e) == "NotImplemented"
