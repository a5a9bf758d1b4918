"""Signed-trailer streaming uploads (``STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER``, README "What is
supported"): every chunk signed, then a checksum trailer signed by ``x-amz-trailer-signature``, as
AWS's "Signature Calculations for the Authorization Header: Transferring Payload in Multiple
Chunks" describes. Built here by hand from that description; the gateway must accept it and
refuse any change to the chunks, the trailer or its signature, storing nothing."""

from __future__ import annotations

import base64
import hashlib
import hmac
import xml.etree.ElementTree as ET
import zlib

import pytest
from botocore.exceptions import ClientError
from rawhttp import chunk_signature, send, sign, signing_key

MODE = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
DATA = bytes(range(256)) * 400  # 100 KiB: two 64 KiB chunks
CHUNK = 65536


def crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def body_for(tenant, headers: dict[str, str], data: bytes, trailer: str, sign_trailer: str | None = None,
             trailer_signature: str | None = None, tamper_chunk: bool = False) -> bytes:
    """Signed chunks, the final empty chunk, ``trailer`` (name:value) and its signature over ``sign_trailer``
    (the trailer itself by default); ``trailer_signature=""`` leaves the signature line out."""
    amz_date = headers["X-Amz-Date"]
    scope = f"{amz_date[:8]}/us-east-1/s3/aws4_request"
    key = signing_key(tenant.secret_key, amz_date[:8])
    prev = headers["Authorization"].rsplit("Signature=", 1)[1]
    out = b""
    for piece in [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)] + [b""]:
        sig = chunk_signature(key, amz_date, scope, prev, piece)
        sent = piece[:-1] + bytes([piece[-1] ^ 1]) if tamper_chunk and piece else piece
        out += f"{len(piece):x};chunk-signature={sig}\r\n".encode() + sent + (b"\r\n" if piece else b"")
        prev = sig
    signed_text = (sign_trailer or trailer) + "\n"
    sts = "\n".join(["AWS4-HMAC-SHA256-TRAILER", amz_date, scope, prev, hashlib.sha256(signed_text.encode()).hexdigest()])
    tsig = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest() if trailer_signature is None else trailer_signature
    out += trailer.encode() + b"\r\n"
    if tsig:
        out += f"x-amz-trailer-signature:{tsig}\r\n".encode()
    return out + b"\r\n"


def put(server, tenant, bucket: str, key: str, **kw):
    trailer = kw.pop("trailer", f"x-amz-checksum-crc32:{crc32_b64(DATA)}")
    # Content-Length is signed, so the body is built twice: once to measure it.
    probe_headers = {"X-Amz-Date": "20260101T000000Z", "Authorization": "Signature=" + "0" * 64}
    length = len(body_for(tenant, probe_headers, DATA, trailer, **kw))
    headers = sign(tenant, "PUT", f"{server.endpoint}/{bucket}/{key}", {
        "Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(DATA)), "Content-Length": str(length),
        "x-amz-trailer": "x-amz-checksum-crc32"}, payload_hash=MODE)
    headers["Host"] = server.endpoint.split("//")[1]
    body = body_for(tenant, headers, DATA, trailer, **kw)
    assert len(body) == length
    return send(server.endpoint, "PUT", f"/{bucket}/{key}", headers, body)


def code_of(body: bytes) -> str:
    return ET.fromstring(body).findtext("Code") or ""


def test_a_signed_trailer_upload_is_stored_with_its_checksum(server, tenants, s3, bucket):
    r = put(server, tenants["alice"], bucket, "ok")
    assert r.status == 200, r.body
    assert r.headers["x-amz-checksum-crc32"] == crc32_b64(DATA)
    got = s3.get_object(Bucket=bucket, Key="ok", ChecksumMode="ENABLED")
    assert got["Body"].read() == DATA and got["ChecksumCRC32"] == crc32_b64(DATA)


@pytest.mark.parametrize("change, status, code", [
    ({"trailer_signature": "0" * 64}, 403, "SignatureDoesNotMatch"),  # a forged trailer signature
    ({"trailer_signature": ""}, 403, "SignatureDoesNotMatch"),  # none at all
    ({"trailer": "x-amz-checksum-crc32:AAAAAA==", "sign_trailer": f"x-amz-checksum-crc32:{crc32_b64(DATA)}"}, 403, "SignatureDoesNotMatch"),
    ({"tamper_chunk": True}, 403, "SignatureDoesNotMatch"),  # a chunk changed after signing
    ({"trailer": "x-amz-checksum-crc32:AAAAAA=="}, 400, "BadDigest"),  # signed, but the checksum is wrong
], ids=["forged-signature", "no-signature", "trailer-changed-after-signing", "chunk-changed", "wrong-checksum"])
def test_a_changed_signed_trailer_upload_is_refused_and_nothing_stored(server, tenants, s3, bucket, change, status, code):
    r = put(server, tenants["alice"], bucket, "refused", **change)
    assert (r.status, code_of(r.body)) == (status, code), r.body
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="refused")
