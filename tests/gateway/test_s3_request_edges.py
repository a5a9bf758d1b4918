"""S3 request edges an outside conformance run found (issue 23 item 11)."""

from __future__ import annotations

import pytest
from rawhttp import send


@pytest.mark.parametrize("query", ["X-Amz-Expires=100000", "X-Amz-Expires=abc", "X-Amz-Expires=100&X-Amz-Date=20260101T000000Z",
                                   "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires=100"])
@pytest.mark.parametrize("acl", ["private", "public-read"])
def test_a_presigned_style_get_missing_its_signature_is_400_not_403(server, s3, bucket, query, acl):
    s3.put_object(Bucket=bucket, Key="obj", Body=b"x", ACL=acl)
    host = server.endpoint.split("//", 1)[1]
    r = send(server.endpoint, "GET", f"/{bucket}/obj?{query}", headers={"Host": host})
    assert r.status == 400 and b"<Code>AuthorizationQueryParametersError</Code>" in r.body, (r.status, r.body)


def test_an_anonymous_get_of_a_public_object_still_works(server, s3, bucket):
    s3.put_object(Bucket=bucket, Key="pub", Body=b"open", ACL="public-read")
    host = server.endpoint.split("//", 1)[1]
    r = send(server.endpoint, "GET", f"/{bucket}/pub?response-content-type=text/plain", headers={"Host": host})
    assert r.status == 200 and r.body == b"open"


@pytest.mark.parametrize("prefix", ["\n", "a\nb", "é/ü", "sp ace"])
def test_a_v1_listing_echoes_its_prefix_as_sent(s3, bucket, prefix):
    s3.put_object(Bucket=bucket, Key=f"{prefix}k", Body=b"x")
    r = s3.list_objects(Bucket=bucket, Prefix=prefix)  # botocore adds encoding-type=url and decodes keys, not Prefix
    assert r["Prefix"] == prefix and [o["Key"] for o in r["Contents"]] == [f"{prefix}k"]
    assert s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Prefix"] == prefix


def test_a_location_constraint_the_operator_made_an_alias_of_the_region_is_accepted(tmp_path):
    from botocore.exceptions import ClientError
    from support import ServerProcess, boto_client, make_tenants, write_config

    tenant = make_tenants("loc")[0]
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra='\n[gateway]\nregion_aliases = ["default"]\n')
    proc = ServerProcess(config, "gateway").start()
    try:
        s3 = boto_client(proc.endpoint, tenant)
        s3.create_bucket(Bucket="aliased", CreateBucketConfiguration={"LocationConstraint": "default"})
        assert s3.head_bucket(Bucket="aliased")["ResponseMetadata"]["HTTPHeaders"]["x-amz-bucket-region"] == "us-east-1"
        with pytest.raises(ClientError) as e:
            s3.create_bucket(Bucket="elsewhere", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        assert e.value.response["Error"]["Code"] == "InvalidLocationConstraint"
    finally:
        proc.stop()
