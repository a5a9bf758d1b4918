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


def anonymous_get(url: str, method: str = "GET", body: bytes | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, method=method), timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def anonymous_head(url: str) -> tuple[int, str | None]:
    """(status, Content-Length) of an unsigned HEAD."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=30) as r:
            return r.status, r.headers.get("Content-Length")
    except urllib.error.HTTPError as e:
        return e.code, None


def test_public_read_really_allows_anonymous_reads_of_that_object_only(server, s3, s3_bob, bucket):
    s3.put_object(Bucket=bucket, Key="public", Body=b"for everyone", ACL="public-read")
    s3.put_object(Bucket=bucket, Key="private", Body=b"mine")
    assert anonymous_get(f"{server.endpoint}/{bucket}/public") == (200, b"for everyone")
    assert anonymous_head(f"{server.endpoint}/{bucket}/public") == (200, str(len(b"for everyone")))
    assert anonymous_head(f"{server.endpoint}/{bucket}/private")[0] == 403
    assert s3_bob.get_object(Bucket=bucket, Key="public")["Body"].read() == b"for everyone"  # another tenant, too
    for key in ("private", "missing"):  # a missing key does not reveal itself
        status, body = anonymous_get(f"{server.endpoint}/{bucket}/{key}")
        assert status == 403 and b"AccessDenied" in body
    assert anonymous_get(f"{server.endpoint}/{bucket}")[0] == 403  # listing stays private
    grants = s3.get_object_acl(Bucket=bucket, Key="public")["Grants"]
    assert ("http://acs.amazonaws.com/groups/global/AllUsers", "READ") in [(g["Grantee"].get("URI"), g["Permission"]) for g in grants]
    s3.put_object_acl(Bucket=bucket, Key="public", ACL="private")
    assert anonymous_get(f"{server.endpoint}/{bucket}/public")[0] == 403
    assert anonymous_head(f"{server.endpoint}/{bucket}/public")[0] == 403
    with pytest.raises(ClientError) as e:
        s3_bob.get_object(Bucket=bucket, Key="public")
    assert code(e) == "AccessDenied"


def test_authenticated_read_lets_any_signed_tenant_read_but_no_anonymous_request(server, s3, s3_bob, bucket):
    s3.put_object(Bucket=bucket, Key="signed-only", Body=b"tenants", ACL="authenticated-read")
    assert s3_bob.get_object(Bucket=bucket, Key="signed-only")["Body"].read() == b"tenants"
    assert s3_bob.head_object(Bucket=bucket, Key="signed-only")["ContentLength"] == 7
    status, body = anonymous_get(f"{server.endpoint}/{bucket}/signed-only")
    assert status == 403 and b"AccessDenied" in body
    assert anonymous_head(f"{server.endpoint}/{bucket}/signed-only")[0] == 403
    grants = s3.get_object_acl(Bucket=bucket, Key="signed-only")["Grants"]
    assert ("http://acs.amazonaws.com/groups/global/AuthenticatedUsers", "READ") in [(g["Grantee"].get("URI"), g["Permission"]) for g in grants]


def test_public_read_write_is_read_by_anyone_and_written_only_by_the_owner(server, s3, s3_bob, bucket):
    s3.put_bucket_acl(Bucket=bucket, ACL="public-read-write")
    s3.put_object(Bucket=bucket, Key="prw", Body=b"open", ACL="public-read-write")
    assert anonymous_get(f"{server.endpoint}/{bucket}/prw") == (200, b"open")
    assert s3_bob.get_object(Bucket=bucket, Key="prw")["Body"].read() == b"open"
    # Writes stay the owner's, signed or not, whatever the canned ACL says.
    assert anonymous_get(f"{server.endpoint}/{bucket}/prw", "PUT", b"overwritten")[0] == 403
    assert anonymous_get(f"{server.endpoint}/{bucket}/new", "PUT", b"planted")[0] == 403
    for key in ("prw", "new"):
        with pytest.raises(ClientError) as e:
            s3_bob.put_object(Bucket=bucket, Key=key, Body=b"bob was here")
        assert code(e) == "AccessDenied"
    with pytest.raises(ClientError) as e:
        s3_bob.delete_object(Bucket=bucket, Key="prw")
    assert code(e) == "AccessDenied"
    assert s3.get_object(Bucket=bucket, Key="prw")["Body"].read() == b"open"
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="new")


@pytest.mark.parametrize("acl", ["public-read", "public-read-write", "authenticated-read"])
def test_a_public_buckets_listing_stays_the_owners(server, s3, s3_bob, bucket, acl):
    """README: public-read opens objects to anyone; listings stay the owner's, whatever the bucket's canned ACL."""
    s3.put_bucket_acl(Bucket=bucket, ACL=acl)
    s3.put_object(Bucket=bucket, Key="listed", Body=b"x", ACL="public-read")
    for query in ("", "?list-type=2", "?uploads", "?versions"):
        status, body = anonymous_get(f"{server.endpoint}/{bucket}{query}")
        assert status == 403 and b"listed" not in body, (query, status, body)
    with pytest.raises(ClientError) as e:
        s3_bob.list_objects_v2(Bucket=bucket)
    assert code(e) == "AccessDenied"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["listed"]


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
