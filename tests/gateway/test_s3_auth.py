"""SigV4 authentication: headers, presigned URLs, payload modes, addressing styles."""

from __future__ import annotations

import base64
import datetime
import hashlib
import socket
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
import zlib
from email.utils import formatdate
from urllib.parse import urlsplit

import botocore.auth
import pytest
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from rawhttp import chunk_signature, presign, send, sign, sign_v2, signed, signing_key
from support import TenantKeys, boto_client


def code_of(body: bytes) -> str:
    return ET.fromstring(body).findtext("Code")


def test_wrong_secret_is_signature_mismatch(server, tenants):
    t = tenants["alice"]
    bad = boto_client(server.endpoint, TenantKeys("alice", t.access_key, t.secret_key + "x"))
    with pytest.raises(ClientError) as e:
        bad.list_buckets()
    assert e.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_unknown_access_key(server):
    bad = boto_client(server.endpoint, TenantKeys("nobody", "AKNOTAKEY", "secret"))
    with pytest.raises(ClientError) as e:
        bad.list_buckets()
    assert e.value.response["Error"]["Code"] == "InvalidAccessKeyId"


def test_clock_skew_is_refused(server, tenants):
    past = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) - datetime.timedelta(hours=1)
    r = signed(server.endpoint, tenants["alice"], "GET", "/", when=past)
    assert r.status == 403 and code_of(r.body) == "RequestTimeTooSkewed"


def test_anonymous_request_is_denied(server, bucket):
    r = send(server.endpoint, "GET", f"/{bucket}", {"Host": "127.0.0.1"})
    assert r.status == 403 and code_of(r.body) == "AccessDenied"


def test_error_body_request_id_matches_header(server, tenants, bucket):
    r = signed(server.endpoint, tenants["alice"], "GET", f"/{bucket}/missing-key")
    doc = ET.fromstring(r.body)
    assert r.status == 404
    assert doc.findtext("Code") == "NoSuchKey"
    assert doc.findtext("Message")
    assert doc.findtext("Resource") == f"/{bucket}/missing-key"
    assert doc.findtext("RequestId") == r.headers["x-amz-request-id"]


@pytest.fixture(params=["s3", "s3v4"], ids=["sigv2", "sigv4"])
def presigner(request, server, tenants):
    """boto3 presigns S3 URLs with SigV2 unless told s3v4; both must work."""
    return boto_client(server.endpoint, tenants["alice"], signature_version=request.param)


def test_presigned_get_downloads_with_plain_http(s3, presigner, bucket):
    s3.put_object(Bucket=bucket, Key="p/q r+ü.txt", Body=b"presigned bytes")
    url = presigner.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "p/q r+ü.txt"}, ExpiresIn=60)
    with urllib.request.urlopen(url) as resp:
        assert resp.read() == b"presigned bytes"


def test_presigned_put_uploads(server, s3, presigner, bucket):
    url = presigner.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "up"}, ExpiresIn=60)
    path = url.split(server.endpoint, 1)[1]
    r = send(server.endpoint, "PUT", path, {"Host": server.endpoint.split("//")[1], "Content-Length": "8"}, b"uploaded")
    assert r.status == 200, r.body
    assert s3.get_object(Bucket=bucket, Key="up")["Body"].read() == b"uploaded"


def test_presigned_url_expires(s3, presigner, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    url = presigner.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=1)
    time.sleep(2.1)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url)
    body = e.value.read()
    assert e.value.code == 403 and code_of(body) == "AccessDenied" and b"expired" in body


@pytest.mark.parametrize("expires_in", [604801, 10**9, -1])
def test_presigned_v4_validity_outside_0_to_7_days_is_access_denied(server, tenants, s3, bucket, expires_in):
    """A SigV4 URL valid for more than 604800 s, or for a negative time, can never be used: 403 AccessDenied."""
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    for method in ("GET", "PUT"):
        url = presign(tenants["alice"], method, f"{server.endpoint}/{bucket}/k", expires_in)
        assert f"X-Amz-Expires={expires_in}&" in url
        r = _send_url(server, method, url, b"" if method == "GET" else b"new")
        assert r.status == 403 and code_of(r.body) == "AccessDenied", r.body
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"x"


def _send_url(server, method: str, url: str, body: bytes = b""):
    u = urlsplit(url)
    headers = {"Host": u.netloc, **({"Content-Length": str(len(body))} if method == "PUT" else {})}
    return send(server.endpoint, method, f"{u.path}?{u.query}", headers, body)


@pytest.mark.parametrize("signature_version", ["s3", "s3v4"], ids=["sigv2", "sigv4"])
@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_expired_presigned_url_is_access_denied(server, tenants, s3, bucket, signature_version, method):
    s3.put_object(Bucket=bucket, Key="k", Body=b"original")
    url = presign(tenants["alice"], method, f"{server.endpoint}/{bucket}/k", 3600, signature_version, signed_at=time.time() - 7200)
    r = _send_url(server, method, url, b"" if method == "GET" else b"replaced")
    assert r.status == 403 and code_of(r.body) == "AccessDenied" and b"expired" in r.body
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"original"


@pytest.mark.parametrize("signature_version", ["s3", "s3v4"], ids=["sigv2", "sigv4"])
@pytest.mark.parametrize("method", ["GET", "PUT"])
@pytest.mark.parametrize("signed_ago,expires_in", [(0, 604800), (3600, 7200), (6 * 86400, 604800)],
                         ids=["seven-days", "signed-an-hour-ago", "signed-six-days-ago"])
def test_presigned_url_works_throughout_its_validity(server, tenants, s3, bucket, signature_version, method, signed_ago, expires_in):
    """However long ago it was signed (beyond the clock-skew window too), a URL inside its validity works."""
    s3.put_object(Bucket=bucket, Key="k", Body=b"original")
    url = presign(tenants["alice"], method, f"{server.endpoint}/{bucket}/k", expires_in, signature_version, signed_at=time.time() - signed_ago)
    r = _send_url(server, method, url, b"" if method == "GET" else b"replaced")
    assert r.status == 200, r.body
    if method == "GET":
        assert r.body == b"original"
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == (b"original" if method == "GET" else b"replaced")


def test_presigned_url_tampered(s3, presigner, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    url = presigner.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=60)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url.replace("/k?", "/other?"))
    assert e.value.code == 403 and code_of(e.value.read()) == "SignatureDoesNotMatch"


def test_signed_payload_hash_mismatch_is_refused(server, tenants, s3, bucket):
    body = b"the real body"
    h = sign(tenants["alice"], "PUT", f"{server.endpoint}/{bucket}/k", body=body, payload_hash=hashlib.sha256(b"other").hexdigest())
    h["Content-Length"] = str(len(body))
    r = send(server.endpoint, "PUT", f"/{bucket}/k", h, body)
    assert r.status == 400 and code_of(r.body) == "XAmzContentSHA256Mismatch"
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="k")


def test_unsigned_payload(server, tenants, s3, bucket):
    r = signed(server.endpoint, tenants["alice"], "PUT", f"/{bucket}/u", body=b"unsigned", payload_hash="UNSIGNED-PAYLOAD")
    assert r.status == 200
    assert s3.get_object(Bucket=bucket, Key="u")["Body"].read() == b"unsigned"


def test_expect_100_continue(server, tenants, s3, bucket):
    """The client sends the headers alone and the body only once the gateway has answered 100 Continue."""
    body = b"continued"
    headers = sign(tenants["alice"], "PUT", f"{server.endpoint}/{bucket}/e", {"Expect": "100-continue"}, body)
    headers["Content-Length"] = str(len(body))
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:  # bounded: a missing 100 fails, not hangs
        head = f"PUT /{bucket}/e HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        conn.sendall(head.encode())
        reader = conn.makefile("rb")
        interim = reader.readline()
        assert interim.startswith(b"HTTP/1.1 100"), interim  # before any byte of the body was sent
        while reader.readline() not in (b"\r\n", b""):
            pass
        conn.sendall(body)
        final = reader.readline()
        assert final.startswith(b"HTTP/1.1 200"), final
    assert s3.get_object(Bucket=bucket, Key="e")["Body"].read() == body


def test_virtual_hosted_style(server, tenants, s3, bucket):
    s3.put_object(Bucket=bucket, Key="dir/vh.txt", Body=b"virtual")
    host = f"{bucket}.localhost:{server.port}"
    r = signed(server.endpoint, tenants["alice"], "GET", "/dir/vh.txt", host=host)
    assert r.status == 200 and r.body == b"virtual"
    r = signed(server.endpoint, tenants["alice"], "GET", "/?list-type=2", host=host)
    assert r.status == 200 and b"<Key>dir/vh.txt</Key>" in r.body


# --- aws-chunked bodies ---------------------------------------------------------


def _chunked_unsigned_trailer(data: bytes, chunk: int, trailer: str) -> bytes:
    out = b""
    for i in range(0, len(data), chunk):
        piece = data[i : i + chunk]
        out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    return out + b"0\r\n" + trailer.encode() + b"\r\n\r\n"


def _crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def _put_chunked(server, tenant, bucket, key, body, decoded_len, mode, trailer_name=None, when=None):
    headers = {"Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": str(decoded_len), "Content-Length": str(len(body))}
    if trailer_name:
        headers["x-amz-trailer"] = trailer_name
    h = sign(tenant, "PUT", f"{server.endpoint}/{bucket}/{key}", headers, payload_hash=mode, when=when)
    h["Host"] = server.endpoint.split("//")[1]
    return send(server.endpoint, "PUT", f"/{bucket}/{key}", h, body), h


def test_aws_chunked_unsigned_trailer_with_crc32(server, tenants, s3, bucket):
    data = bytes(range(256)) * 300
    body = _chunked_unsigned_trailer(data, 8192, f"x-amz-checksum-crc32:{_crc32_b64(data)}")
    r, _ = _put_chunked(server, tenants["alice"], bucket, "t", body, len(data), "STREAMING-UNSIGNED-PAYLOAD-TRAILER", "x-amz-checksum-crc32")
    assert r.status == 200, r.body
    assert r.headers["x-amz-checksum-crc32"] == _crc32_b64(data)
    got = s3.get_object(Bucket=bucket, Key="t", ChecksumMode="ENABLED")
    assert got["Body"].read() == data and got["ChecksumCRC32"] == _crc32_b64(data)


def test_aws_chunked_trailer_checksum_mismatch(server, tenants, s3, bucket):
    data = b"payload" * 1000
    body = _chunked_unsigned_trailer(data, 4096, f"x-amz-checksum-crc32:{_crc32_b64(b'different')}")
    r, _ = _put_chunked(server, tenants["alice"], bucket, "bad", body, len(data), "STREAMING-UNSIGNED-PAYLOAD-TRAILER", "x-amz-checksum-crc32")
    assert r.status == 400 and code_of(r.body) == "BadDigest"
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="bad")


def _signed_chunked_body(tenant, headers, data, chunk, tamper=False):
    auth = headers["Authorization"]
    seed = auth.rsplit("Signature=", 1)[1]
    amz_date = headers["X-Amz-Date"]
    scope = f"{amz_date[:8]}/us-east-1/s3/aws4_request"
    key = signing_key(tenant.secret_key, amz_date[:8])
    out, prev = b"", seed
    pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)] + [b""]
    for piece in pieces:
        sig = chunk_signature(key, amz_date, scope, prev, piece)
        if tamper and piece:
            sig = "0" * 64
        out += f"{len(piece):x};chunk-signature={sig}\r\n".encode() + piece + b"\r\n"
        prev = sig
    return out


@pytest.mark.parametrize("tamper", [False, True])
def test_aws_chunked_signed_payload(server, tenants, s3, bucket, tamper):
    tenant = tenants["alice"]
    data = b"0123456789abcdef" * 5000
    chunk = 65536
    n_chunks = -(-len(data) // chunk)
    length = sum(len(f"{min(chunk, len(data) - i):x};chunk-signature=".encode()) + 64 + 2 + min(chunk, len(data) - i) + 2 for i in range(0, len(data), chunk))
    length += len("0;chunk-signature=") + 64 + 4
    assert n_chunks == 2
    _, headers = None, sign(tenant, "PUT", f"{server.endpoint}/{bucket}/s", {
        "Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(data)), "Content-Length": str(length)},
        payload_hash="STREAMING-AWS4-HMAC-SHA256-PAYLOAD")
    headers["Host"] = server.endpoint.split("//")[1]
    body = _signed_chunked_body(tenant, headers, data, chunk, tamper)
    assert len(body) == length
    r = send(server.endpoint, "PUT", f"/{bucket}/s", headers, body)
    if tamper:
        assert r.status == 403 and code_of(r.body) == "SignatureDoesNotMatch"
        with pytest.raises(ClientError):
            s3.head_object(Bucket=bucket, Key="s")
    else:
        assert r.status == 200, r.body
        assert s3.get_object(Bucket=bucket, Key="s")["Body"].read() == data


def test_presigned_listing_works_with_either_signature_version(s3, presigner, bucket):
    """SigV2 signs a bucket as "/bucket/" even for a path-style "/bucket" URL (botocore, s3cmd)."""
    s3.put_object(Bucket=bucket, Key="listed", Body=b"x")
    for op in ("list_objects", "list_objects_v2"):
        url = presigner.generate_presigned_url(op, Params={"Bucket": bucket}, ExpiresIn=60)
        with urllib.request.urlopen(url) as resp:
            assert resp.status == 200 and b"<Key>listed</Key>" in resp.read()


# --- request dates: X-Amz-Date, Date, or both -----------------------------------


def _put_and_read_back(server, s3, bucket, headers, key="dated"):
    r = send(server.endpoint, "PUT", f"/{bucket}/{key}", headers, b"dated body")
    assert r.status == 200, r.body
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"dated body"


@pytest.mark.parametrize("date_too", [None, "rfc1123", "iso8601"], ids=["x-amz-date-alone", "with-rfc1123-date", "with-iso8601-date"])
def test_sigv4_accepts_x_amz_date_alone_or_beside_a_date_header(server, tenants, s3, bucket, date_too):
    """X-Amz-Date is the request time; a signed Date header beside it, in either form, changes nothing."""
    h = sign(tenants["alice"], "PUT", f"{server.endpoint}/{bucket}/dated", {"Content-Length": "10"}, b"dated body", date_too=date_too)
    assert "X-Amz-Date" in h and ("Date" in h) == (date_too is not None)
    assert "date;" in h["Authorization"] or date_too is None
    _put_and_read_back(server, s3, bucket, h)


def test_sigv4_with_an_unsigned_date_header_beside_x_amz_date(server, tenants, s3, bucket):
    h = sign(tenants["alice"], "PUT", f"{server.endpoint}/{bucket}/dated", {"Content-Length": "10"}, b"dated body")
    h["Date"] = "Mon, 01 Jan 2001 00:00:00 GMT"  # not signed, and far from now: X-Amz-Date decides
    _put_and_read_back(server, s3, bucket, h)


def test_sigv4_with_date_header_instead_of_x_amz_date(server, tenants, s3, bucket):
    """botocore's SigV4 signer, given a Date header, signs with Date (RFC 1123) and sends no X-Amz-Date."""
    h = sign(tenants["alice"], "PUT", f"{server.endpoint}/{bucket}/dated", {"Content-Length": "10", "Date": "x"}, b"dated body")
    assert "X-Amz-Date" not in h and h["Date"].endswith(("GMT", "-0000"))
    _put_and_read_back(server, s3, bucket, h)


def _v2_headers(**dates: str) -> dict[str, str]:
    return {"Content-Length": "10", "Content-Type": "text/plain", "Host": "127.0.0.1", **dates}


def _rfc1123() -> str:
    return formatdate(usegmt=True)


def _iso8601() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


@pytest.mark.parametrize("dates,date_line", [
    (lambda: {"Date": _rfc1123()}, "Date"),
    (lambda: {"x-amz-date": _rfc1123()}, ""),
    (lambda: {"x-amz-date": _iso8601()}, ""),
    (lambda: {"Date": _rfc1123(), "x-amz-date": _rfc1123()}, ""),
    (lambda: {"Date": _rfc1123(), "x-amz-date": _iso8601()}, ""),
], ids=["date-alone", "x-amz-date-rfc1123", "x-amz-date-iso8601", "both-rfc1123", "both-x-amz-date-iso8601"])
def test_sigv2_header_auth_with_either_date_header_in_either_form(server, tenants, s3, bucket, dates, date_line):
    """SigV2: with X-Amz-Date (either form) the string to sign's Date line is empty, as AWS specifies."""
    h = _v2_headers(**dates())
    h = sign_v2(tenants["alice"], "PUT", f"/{bucket}/dated", h, h["Date"] if date_line == "Date" else "")
    _put_and_read_back(server, s3, bucket, h)


def test_sigv2_as_botocore_signs_it_with_x_amz_date(server, tenants, s3, bucket):
    """botocore's HmacV1Auth keeps the Date line even when an x-amz-date header is sent: accepted too."""
    req = AWSRequest(method="PUT", url=f"{server.endpoint}/{bucket}/dated", data=b"dated body",
                     headers={"x-amz-date": _rfc1123(), "Content-Type": "text/plain"})
    botocore.auth.HmacV1Auth(Credentials(tenants["alice"].access_key, tenants["alice"].secret_key)).add_auth(req)
    h = {**dict(req.headers.items()), "Host": server.endpoint.split("//")[1], "Content-Length": "10"}
    assert h["Date"] and h["x-amz-date"]
    _put_and_read_back(server, s3, bucket, h)


def test_sigv2_stale_x_amz_date_is_skewed_even_with_a_fresh_date(server, tenants, bucket):
    """X-Amz-Date is the request time whenever it is present."""
    stale = formatdate(time.time() - 3600, usegmt=True)
    h = _v2_headers(Date=_rfc1123(), **{"x-amz-date": stale})
    r = send(server.endpoint, "PUT", f"/{bucket}/dated", sign_v2(tenants["alice"], "PUT", f"/{bucket}/dated", h, ""), b"dated body")
    assert r.status == 403 and code_of(r.body) == "RequestTimeTooSkewed"
