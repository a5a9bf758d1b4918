"""The route table: which operation a request shape selects, and the shapes that select none.

``Router.match`` is a pure function of (method, address level, query, header
names), so these cases need no server.
"""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from gateway.s3api.context import Level
from gateway.s3api.router import UNSUPPORTED_SUBRESOURCES, address
from gateway.server import ROUTER
from protocol.errors import ErrorCode, S3Error

S, B, O = Level.SERVICE, Level.BUCKET, Level.OBJECT
COPY = {"x-amz-copy-source": "src/key"}

# (method, level, query, headers, operation): one row per operation the gateway serves.
OPERATIONS = [
    ("GET", S, {}, {}, "ListBuckets"),
    ("PUT", B, {}, {}, "CreateBucket"),
    ("HEAD", B, {}, {}, "HeadBucket"),
    ("DELETE", B, {}, {}, "DeleteBucket"),
    ("GET", B, {"location": ""}, {}, "GetBucketLocation"),
    ("GET", B, {"lifecycle": ""}, {}, "GetBucketLifecycleConfiguration"),
    ("PUT", B, {"lifecycle": ""}, {}, "PutBucketLifecycleConfiguration"),
    ("DELETE", B, {"lifecycle": ""}, {}, "DeleteBucketLifecycle"),
    ("GET", B, {"versioning": ""}, {}, "GetBucketVersioning"),
    ("PUT", B, {"versioning": ""}, {}, "PutBucketVersioning"),  # answers 501 itself, naming versioning
    ("GET", B, {"policy": ""}, {}, "GetBucketPolicy"),  # 404 NoSuchBucketPolicy; PUT/DELETE ?policy stay 501
    ("GET", B, {"notification": ""}, {}, "GetBucketNotificationConfiguration"),
    ("GET", B, {}, {}, "ListObjects"),
    ("GET", B, {"list-type": "2"}, {}, "ListObjectsV2"),
    ("GET", B, {"versions": ""}, {}, "ListObjectVersions"),
    ("GET", B, {"uploads": ""}, {}, "ListMultipartUploads"),
    ("POST", B, {"delete": ""}, {}, "DeleteObjects"),
    ("PUT", O, {}, {}, "PutObject"),
    ("PUT", O, {}, COPY, "CopyObject"),
    ("GET", O, {}, {}, "GetObject"),
    ("HEAD", O, {}, {}, "HeadObject"),
    ("DELETE", O, {}, {}, "DeleteObject"),
    ("POST", O, {"uploads": ""}, {}, "CreateMultipartUpload"),
    ("PUT", O, {"uploadId": "u", "partNumber": "1"}, {}, "UploadPart"),
    ("PUT", O, {"uploadId": "u", "partNumber": "1"}, COPY, "UploadPartCopy"),
    ("POST", O, {"uploadId": "u"}, {}, "CompleteMultipartUpload"),
    ("DELETE", O, {"uploadId": "u"}, {}, "AbortMultipartUpload"),
    ("GET", O, {"uploadId": "u"}, {}, "ListParts"),
    ("POST", B, {"kv-get": ""}, {}, "KVGet"),
    ("POST", B, {"kv-put": ""}, {}, "KVPut"),
    ("POST", B, {"kv-lookup": ""}, {}, "KVLookup"),
    ("POST", B, {"kv-estimate": ""}, {}, "KVEstimate"),
    ("POST", B, {"kv-session": ""}, {}, "KVSession"),
    ("POST", S, {"kv-register": ""}, {}, "KVRegister"),
    ("POST", S, {"kv-unregister": ""}, {}, "KVUnregister"),
    ("POST", S, {"kv-register-rdma": ""}, {}, "KVRegisterRdma"),
    ("GET", B, {"tagging": ""}, {}, "GetBucketTagging"),
    ("PUT", B, {"tagging": ""}, {}, "PutBucketTagging"),
    ("DELETE", B, {"tagging": ""}, {}, "DeleteBucketTagging"),
    ("GET", O, {"tagging": ""}, {}, "GetObjectTagging"),
    ("PUT", O, {"tagging": ""}, {}, "PutObjectTagging"),
    ("DELETE", O, {"tagging": ""}, {}, "DeleteObjectTagging"),
    ("GET", B, {"acl": ""}, {}, "GetBucketAcl"),
    ("PUT", B, {"acl": ""}, {}, "PutBucketAcl"),
    ("GET", O, {"acl": ""}, {}, "GetObjectAcl"),
    ("PUT", O, {"acl": ""}, {}, "PutObjectAcl"),
    ("GET", S, {"kv-status": ""}, {}, "KVStatus"),
]

# Shapes that look close to an operation and must select the right neighbour.
NEIGHBOURS = [
    ("GET", B, {"list-type": "1"}, {}, "ListObjects"),  # only list-type=2 is v2
    ("GET", O, {"partNumber": "2"}, {}, "GetObject"),
    ("HEAD", O, {"uploadId": "u"}, {}, "HeadObject"),
    ("PUT", O, {"uploads": ""}, {}, "PutObject"),  # ?uploads is not ?uploadId
    ("GET", S, {"kv-register": ""}, {}, "ListBuckets"),  # kv-register is POST only
    ("GET", S, {"max-buckets": "5"}, {}, "ListBuckets"),
]


@pytest.mark.parametrize("method,level,query,headers,operation", OPERATIONS + NEIGHBOURS)
def test_request_shape_selects_operation(method, level, query, headers, operation):
    route = ROUTER.match(method, level, query, CIMultiDict(headers))
    assert route.operation == operation
    assert (route.method, route.level) == (method, level)


def test_every_route_is_reachable_and_named_once():
    names = [r.operation for r in ROUTER.routes]
    assert sorted(names) == sorted(op for *_, op in OPERATIONS)


def test_copy_source_header_is_matched_case_insensitively():
    assert ROUTER.match("PUT", O, {}, CIMultiDict({"X-Amz-Copy-Source": "a/b"})).operation == "CopyObject"


# (method, level, query, error code): shapes no operation serves.
ERRORS = [
    ("PUT", S, {}, ErrorCode.MethodNotAllowed),
    ("DELETE", S, {}, ErrorCode.MethodNotAllowed),
    ("POST", S, {}, ErrorCode.MethodNotAllowed),
    ("POST", B, {}, ErrorCode.MethodNotAllowed),  # POST on a bucket is only ?delete or a KV extension
    ("POST", O, {}, ErrorCode.MethodNotAllowed),
    ("POST", O, {"kv-get": ""}, ErrorCode.MethodNotAllowed),  # KV extensions are not object-level
    ("PATCH", O, {}, ErrorCode.MethodNotAllowed),
    ("OPTIONS", B, {}, ErrorCode.MethodNotAllowed),
    ("GET", B, {"cors": ""}, ErrorCode.NotImplemented),
    ("PUT", O, {"retention": ""}, ErrorCode.NotImplemented),
    ("POST", B, {"kv-get": "", "versioning": ""}, ErrorCode.NotImplemented),  # before any extension
    ("PATCH", S, {"lifecycle": ""}, ErrorCode.NotImplemented),  # before the method check
    # Two operation-selecting sub-resources: never let one ride on a request authorised for the other.
    ("GET", B, {"location": "", "uploads": ""}, ErrorCode.InvalidRequest),
    ("GET", B, {"uploads": "", "list-type": "2"}, ErrorCode.InvalidRequest),
    ("POST", O, {"uploads": "", "uploadId": "u"}, ErrorCode.InvalidRequest),
    ("POST", B, {"delete": "", "kv-put": ""}, ErrorCode.InvalidRequest),
    ("POST", B, {"delete": "", "kv-get": ""}, ErrorCode.InvalidRequest),
]


@pytest.mark.parametrize("method,level,query,code", ERRORS)
def test_unserved_shapes_are_refused(method, level, query, code):
    with pytest.raises(S3Error) as e:
        ROUTER.match(method, level, query, CIMultiDict())
    assert e.value.code is code


@pytest.mark.parametrize("sub", sorted(UNSUPPORTED_SUBRESOURCES - {"versioning", "policy", "notification", "lifecycle"}))
def test_unsupported_subresource_is_named(sub):
    with pytest.raises(S3Error) as e:
        ROUTER.match("GET", B, {"prefix": "", sub: ""}, CIMultiDict())
    assert e.value.code is ErrorCode.NotImplemented and repr(sub) in e.value.message


@pytest.mark.parametrize("method,level", [("DELETE", B), ("HEAD", B), ("POST", B), ("GET", O), ("PUT", O), ("DELETE", O), ("GET", S)])
def test_versioning_is_served_only_at_get_and_put_bucket(method, level):
    """GetBucketVersioning and PutBucketVersioning serve ?versioning; anywhere else it is 501, never a fallback row
    (DELETE /bucket?versioning must not delete the bucket)."""
    with pytest.raises(S3Error) as e:
        ROUTER.match(method, level, {"versioning": ""}, CIMultiDict())
    assert e.value.code is ErrorCode.NotImplemented and "'versioning'" in e.value.message


@pytest.mark.parametrize("path,host,level,bucket,key", [
    ("/", "127.0.0.1:9000", S, None, None),
    ("/b", "127.0.0.1:9000", B, "b", None),
    ("/b/", "127.0.0.1:9000", B, "b", None),
    ("/b/a%2Fc/d", "127.0.0.1:9000", O, "b", "a/c/d"),
    ("/", "b.localhost:9000", B, "b", None),
    ("/k/x", "b.localhost", O, "b", "k/x"),
])
def test_address_level(path, host, level, bucket, key):
    addr = address(path, host, ("localhost",))
    assert (addr.level, addr.bucket, addr.key) == (level, bucket, key)
