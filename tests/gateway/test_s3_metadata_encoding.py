"""Non-ASCII user metadata comes back as the text that was sent (issue 23 item 11).

botocore refuses non-ASCII ``Metadata``, so a client that wants it sets the header itself (as the s3-tests
conformance suite does): botocore sends it as UTF-8 but reads response headers as ISO-8859-1, so
``Hello Worldé`` survives only as the Latin-1 byte 0xE9. Text Latin-1 cannot carry comes back as the
UTF-8 a UTF-8 client sent; an RFC 2047 encoded-word comes back as sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
from rawhttp import RawResponse, send, sign
from support import ServerProcess, boto_client, make_tenants
from upstream import MotoServer, s3_backend_config

VALUE = "Hello World\xe9"


def signed_request(endpoint: str, tenant, method: str, path: str, body: bytes = b"", headers: dict[str, bytes] | None = None) -> RawResponse:
    """A SigV4 request whose header values go out as these exact bytes; each is signed as the text a client
    would have signed: UTF-8 text where the bytes are UTF-8, else the Latin-1 text http.client sent."""
    def text(b: bytes) -> str:
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return b.decode("latin-1")

    host = endpoint.split("//", 1)[1]
    h = sign(tenant, method, f"http://{host}{path}", {k: text(v) for k, v in (headers or {}).items()}, body)
    out: dict[str, str | bytes] = {**h, **(headers or {}), "Content-Length": str(len(body))} if body else {**h, **(headers or {})}
    return send(endpoint, method, path, out, body)


def _put_with_raw_header(s3, bucket: str, key: str, value: str, **kw) -> None:
    def set_header(params, **_):
        params["headers"]["x-amz-meta-meta1"] = value

    s3.meta.events.register("before-call.s3.PutObject", set_header)
    try:
        s3.put_object(Bucket=bucket, Key=key, Body=b"bar", **kw)
    finally:
        s3.meta.events.unregister("before-call.s3.PutObject", set_header)


def _roundtrip(s3, bucket: str) -> None:
    _put_with_raw_header(s3, bucket, "foo", VALUE)
    assert s3.get_object(Bucket=bucket, Key="foo")["Metadata"]["meta1"] == VALUE
    assert s3.head_object(Bucket=bucket, Key="foo")["Metadata"]["meta1"] == VALUE
    s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "foo"})
    assert s3.head_object(Bucket=bucket, Key="copy")["Metadata"]["meta1"] == VALUE
    # A multipart upload keeps it too.
    def set_header(params, **_):
        params["headers"]["x-amz-meta-meta1"] = VALUE

    s3.meta.events.register("before-call.s3.CreateMultipartUpload", set_header)
    try:
        up = s3.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    finally:
        s3.meta.events.unregister("before-call.s3.CreateMultipartUpload", set_header)
    etag = s3.upload_part(Bucket=bucket, Key="mp", UploadId=up, PartNumber=1, Body=b"x")["ETag"]
    s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=up, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert s3.head_object(Bucket=bucket, Key="mp")["Metadata"]["meta1"] == VALUE


def test_boto3_gets_back_the_non_ascii_metadata_it_set(s3, bucket):
    _roundtrip(s3, bucket)


@pytest.mark.parametrize(("sent", "back"), [
    ("Hello World\xe9".encode("utf-8"), b"Hello World\xe9"),  # UTF-8 in, Latin-1 out: the text boto3 sent
    ("Hello World\xe9".encode("latin-1"), b"Hello World\xe9"),  # curl sending Latin-1 gets its bytes back
    ("Grüße 日本".encode("utf-8"), "Grüße 日本".encode("utf-8")),  # beyond Latin-1: UTF-8 as a UTF-8 client sent it
    (b"=?UTF-8?B?SGVsbG8gV29ybGTDqQ==?=", b"=?UTF-8?B?SGVsbG8gV29ybGTDqQ==?="),
    (b"plain ascii", b"plain ascii"),
])
def test_the_response_header_carries_the_text_that_was_sent(server, tenants, s3, bucket, sent, back):
    r = signed_request(server.endpoint, tenants["alice"], "PUT", f"/{bucket}/raw", body=b"v", headers={"x-amz-meta-m": sent})
    assert r.status == 200, r.body
    for method in ("GET", "HEAD"):
        r = signed_request(server.endpoint, tenants["alice"], method, f"/{bucket}/raw")
        assert r.status == 200
        assert r.headers["x-amz-meta-m"].encode("latin-1") == back  # http.client decoded the raw bytes as Latin-1


def test_a_large_object_streams_with_its_metadata(s3, bucket):
    body = b"x" * (1 << 20)  # past the gateway's prefetch: a streamed response
    def set_header(params, **_):
        params["headers"]["x-amz-meta-meta1"] = VALUE

    s3.meta.events.register("before-call.s3.PutObject", set_header)
    try:
        s3.put_object(Bucket=bucket, Key="big", Body=body)
    finally:
        s3.meta.events.unregister("before-call.s3.PutObject", set_header)
    r = s3.get_object(Bucket=bucket, Key="big")
    assert r["Metadata"]["meta1"] == VALUE and r["Body"].read() == body


def test_aws_cli_shows_the_metadata_boto3_set(server, tenants, s3, bucket):
    aws = os.environ.get("TEST_AWS_CLI")
    if not aws:
        pytest.skip("TEST_AWS_CLI names no aws binary")
    _put_with_raw_header(s3, bucket, "foo", VALUE)
    t = tenants["alice"]
    env = dict(os.environ, AWS_ACCESS_KEY_ID=t.access_key, AWS_SECRET_ACCESS_KEY=t.secret_key, AWS_DEFAULT_REGION="us-east-1",
               AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull, PYTHONIOENCODING="utf-8")
    out = subprocess.run([aws, "--endpoint-url", server.endpoint, "s3api", "head-object", "--bucket", bucket, "--key", "foo"],
                         env=env, capture_output=True, check=True, timeout=60)
    assert json.loads(out.stdout.decode("utf-8"))["Metadata"] == {"meta1": VALUE}


def test_the_s3_backend_keeps_the_bytes_too(tmp_path):
    moto = MotoServer(tmp_path / "moto.log").start()
    tenant = make_tenants("meta")[0]
    node = ServerProcess(s3_backend_config(tmp_path, moto, [tenant])).start()
    try:
        s3 = boto_client(node.endpoint, tenant)
        bucket = f"meta-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(Bucket=bucket)
        _roundtrip(s3, bucket)
        sent = "Grüße".encode("utf-8")
        assert signed_request(node.endpoint, tenant, "PUT", f"/{bucket}/raw", body=b"v", headers={"x-amz-meta-m": sent}).status == 200
        assert signed_request(node.endpoint, tenant, "GET", f"/{bucket}/raw").headers["x-amz-meta-m"] == "Grüße"
    finally:
        node.stop()
        moto.stop()
