"""Whatever authenticates a request covers every part of it that selects the operation (security audit, defect 3):
a presigned URL for one operation cannot be turned into a KV operation by appending its sub-resource."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from kvsupport import client, keys_for, make_chunks, run, tiny_layout
from rawhttp import signed
from support import boto_client

from protocol.wire import Descriptor, Target, TransportKind, encode_descriptor

LAYOUT = tiny_layout(16, num_layers=2)


@pytest.fixture(scope="module")
def chunks_bucket(server, tenants, s3):
    bucket = "kv-auth-coverage"
    s3.create_bucket(Bucket=bucket)
    keys = keys_for(LAYOUT, 4, "auth")

    async def put():
        async with client(server, tenants["alice"], bucket) as c:
            await c.put_chunks(keys, make_chunks(LAYOUT, 4, seed=2), LAYOUT)

    run(put())
    return bucket, keys


def post(url: str, body: bytes, method: str = "POST") -> int:
    req = urllib.request.Request(url, data=body if method == "POST" else None, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.parametrize("signature_version", ["s3", "s3v4"])
@pytest.mark.parametrize("extension", ["kv-get", "kv-put", "kv-lookup"])
def test_a_kv_sub_resource_appended_to_a_presigned_url_is_refused(server, tenants, chunks_bucket, signature_version, extension):
    bucket, keys = chunks_bucket
    presigner = boto_client(server.endpoint, tenants["alice"], signature_version=signature_version)
    if signature_version == "s3":  # the audit's case: a presigned POST ?delete, same method as every KV operation
        url = presigner.generate_presigned_url("delete_objects", Params={"Bucket": bucket, "Delete": {"Objects": [{"Key": "x"}]}}, ExpiresIn=60)
    else:  # botocore presigns no SigV4 POST with a body; a presigned listing URL carries the same query signature
        url = presigner.generate_presigned_url("list_objects_v2", Params={"Bucket": bucket}, ExpiresIn=60)
    n = len(keys)
    body = encode_descriptor(Descriptor(keys, LAYOUT.num_layers, LAYOUT.chunk_tokens, LAYOUT.per_layer_chunk_bytes,
                                        Target(TransportKind.HTTP, length=n * LAYOUT.chunk_bytes)))
    assert post(f"{url}&{extension}", body) in (400, 403)


@pytest.mark.parametrize("signature_version", ["s3", "s3v4"])
def test_kv_status_cannot_ride_on_a_presigned_list_buckets_url(server, tenants, signature_version):
    presigner = boto_client(server.endpoint, tenants["alice"], signature_version=signature_version)
    url = presigner.generate_presigned_url("list_buckets", ExpiresIn=60)
    sep = "&" if "?" in url else "?"
    assert post(f"{url}{sep}kv-status", b"", method="GET") == 403


def test_a_signed_request_naming_two_operations_is_refused(server, tenants, chunks_bucket):
    bucket, _ = chunks_bucket
    r = signed(server.endpoint, tenants["alice"], "POST", f"/{bucket}?delete&kv-get", body=b"<Delete/>")
    assert r.status == 400 and b"InvalidRequest" in r.body and b"more than one operation" in r.body
