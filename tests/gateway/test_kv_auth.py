"""Whatever authenticates a request covers every part of it that selects the operation (security audit, defect 3):
a presigned URL for one operation cannot be turned into a KV operation by appending its sub-resource."""

from __future__ import annotations

import base64
import hashlib
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import botocore.auth
import pytest
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from kvsupport import client, keys_for, make_chunks, run, tiny_layout
from rawhttp import RawResponse, send, signed
from support import boto_client

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


def presigned_delete(endpoint: str, tenant, bucket: str, signature_version: str, body: bytes) -> tuple[str, dict[str, str]]:
    """A presigned ``POST /{bucket}?delete`` URL (botocore's own query signers) and the headers it was signed with.

    botocore's ``generate_presigned_url`` presigns no request with a body; the signers it uses are applied
    to the same request here. Content-MD5 is what S3 requires on DeleteObjects (SigV2 signs it)."""
    headers = {"Content-MD5": base64.b64encode(hashlib.md5(body).digest()).decode()}
    req = AWSRequest(method="POST", url=f"{endpoint}/{bucket}/?delete", headers=dict(headers))  # presigning never signs the body
    creds = Credentials(tenant.access_key, tenant.secret_key)
    signer = (botocore.auth.HmacV1QueryAuth(creds, expires=60) if signature_version == "s3"
              else botocore.auth.S3SigV4QueryAuth(creds, "s3", "us-east-1", expires=60))
    signer.add_auth(req)
    return req.prepare().url, headers


def send_to(url: str, method: str, headers: dict[str, str], body: bytes) -> RawResponse:
    u = urlsplit(url)
    return send(f"{u.scheme}://{u.netloc}", method, f"{u.path}?{u.query}", {"Host": u.netloc, "Content-Length": str(len(body)), **headers}, body)


@pytest.mark.parametrize("signature_version", ["s3", "s3v4"])
@pytest.mark.parametrize("extension", ["kv-get", "kv-put", "kv-lookup"])
def test_a_kv_sub_resource_appended_to_a_presigned_url_is_refused(server, tenants, s3, chunks_bucket, signature_version, extension):
    """The same presigned POST, same headers and body, is served as signed and refused once ``&kv-*`` is
    appended, and refused by the signature check (not only by the router's one-operation rule)."""
    bucket, _ = chunks_bucket
    body = b"<Delete><Object><Key>victim</Key></Object></Delete>"
    url, headers = presigned_delete(server.endpoint, tenants["alice"], bucket, signature_version, body)
    s3.put_object(Bucket=bucket, Key="victim", Body=b"x")
    ok = send_to(url, "POST", headers, body)
    assert ok.status == 200 and b"<Deleted><Key>victim</Key>" in ok.body, ok.body  # the presigned request itself works
    s3.put_object(Bucket=bucket, Key="victim", Body=b"x")
    refused = send_to(f"{url}&{extension}", "POST", headers, body)
    assert refused.status == 403 and b"SignatureDoesNotMatch" in refused.body, refused.body
    assert s3.head_object(Bucket=bucket, Key="victim")["ContentLength"] == 1  # and nothing was done


@pytest.mark.parametrize("signature_version", ["s3", "s3v4"])
def test_kv_status_cannot_ride_on_a_presigned_list_buckets_url(server, tenants, signature_version):
    presigner = boto_client(server.endpoint, tenants["alice"], signature_version=signature_version)
    url = presigner.generate_presigned_url("list_buckets", ExpiresIn=60)
    assert post(url, b"", method="GET") == 200  # the presigned URL itself works
    sep = "&" if "?" in url else "?"
    assert post(f"{url}{sep}kv-status", b"", method="GET") == 403


def test_a_signed_request_naming_two_operations_is_refused(server, tenants, chunks_bucket):
    bucket, _ = chunks_bucket
    r = signed(server.endpoint, tenants["alice"], "POST", f"/{bucket}?delete&kv-get", body=b"<Delete/>")
    assert r.status == 400 and b"InvalidRequest" in r.body and b"more than one operation" in r.body
