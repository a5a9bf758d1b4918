"""GetBucketPolicy and GetBucketNotificationConfiguration answer as S3 does for a bucket without them
(minio-py and s3cmd ask; a 501 made them raise)."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError
from multidict import CIMultiDict

from gateway.s3api.context import Level
from gateway.server import ROUTER
from protocol.errors import ErrorCode, S3Error


def test_a_bucket_has_no_policy(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.get_bucket_policy(Bucket=bucket)
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    assert e.value.response["Error"]["Code"] == "NoSuchBucketPolicy"
    with pytest.raises(ClientError) as e:
        s3.put_bucket_policy(Bucket=bucket, Policy='{"Version": "2012-10-17", "Statement": []}')
    assert e.value.response["Error"]["Code"] == "NotImplemented"  # setting one stays unsupported


def test_a_bucket_has_no_notifications(s3, bucket):
    resp = s3.get_bucket_notification_configuration(Bucket=bucket)
    assert not any(k.endswith("Configurations") for k in resp)
    with pytest.raises(ClientError) as e:
        s3.get_bucket_notification_configuration(Bucket="no-such-bucket-here")
    assert e.value.response["Error"]["Code"] == "NoSuchBucket"


def test_another_tenants_bucket_is_refused(s3_bob, bucket):
    for call in (lambda: s3_bob.get_bucket_policy(Bucket=bucket), lambda: s3_bob.get_bucket_notification_configuration(Bucket=bucket)):
        with pytest.raises(ClientError) as e:
            call()
        assert e.value.response["Error"]["Code"] == "AccessDenied"


@pytest.mark.parametrize("sub", ["policy", "notification"])
@pytest.mark.parametrize("method,level", [("PUT", Level.BUCKET), ("DELETE", Level.BUCKET), ("GET", Level.OBJECT), ("PUT", Level.OBJECT)])
def test_only_the_get_is_served(sub, method, level):
    """Setting or deleting a policy or notifications stays 501 naming the sub-resource, never a fallback row
    (DELETE /bucket?policy must not delete the bucket)."""
    with pytest.raises(S3Error) as e:
        ROUTER.match(method, level, {sub: ""}, CIMultiDict())
    assert e.value.code is ErrorCode.NotImplemented and repr(sub) in e.value.message
