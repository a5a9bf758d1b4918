"""The verifier against AWS's published SigV4 examples (S3 developer guide, 2013-05-24 examples)."""

from __future__ import annotations

import asyncio
from calendar import timegm

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.auth.payload import body_stream
from gateway.auth.sigv4 import Credentials, PayloadMode, RequestVerifier
from protocol.errors import S3Error

EXAMPLE = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "example")
EXAMPLE_TIME = float(timegm((2013, 5, 24, 0, 0, 0)))


def verifier() -> RequestVerifier:
    return RequestVerifier({EXAMPLE.access_key: EXAMPLE}.get, clock=lambda: EXAMPLE_TIME)


def headers(**kv: str) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(kv))


def test_get_object_example():
    h = headers(**{
        "Host": "examplebucket.s3.amazonaws.com",
        "Range": "bytes=0-9",
        "x-amz-content-sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "x-amz-date": "20130524T000000Z",
        "Authorization": "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41",
    })
    result = verifier().verify("GET", "/test.txt", "", h)
    assert result.tenant == "example" and result.payload_mode is PayloadMode.SIGNED


def test_get_object_example_wrong_range_fails():
    h = headers(**{
        "Host": "examplebucket.s3.amazonaws.com",
        "Range": "bytes=0-10",
        "x-amz-content-sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "x-amz-date": "20130524T000000Z",
        "Authorization": "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41",
    })
    with pytest.raises(S3Error) as e:
        verifier().verify("GET", "/test.txt", "", h)
    assert e.value.code.name == "SignatureDoesNotMatch"


STREAMING_HEADERS = {
    "Host": "s3.amazonaws.com",
    "x-amz-date": "20130524T000000Z",
    "x-amz-storage-class": "REDUCED_REDUNDANCY",
    "Authorization": "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
    "SignedHeaders=content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length;x-amz-storage-class,"
    "Signature=4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9",
    "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
    "Content-Encoding": "aws-chunked",
    "x-amz-decoded-content-length": "66560",
    "Content-Length": "66824",
}
CHUNK_SIGS = [
    "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
    "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
    "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
]


def _example_body(sigs: list[str]) -> bytes:
    return (
        f"10000;chunk-signature={sigs[0]}\r\n".encode() + b"a" * 65536 + b"\r\n"
        + f"400;chunk-signature={sigs[1]}\r\n".encode() + b"a" * 1024 + b"\r\n"
        + f"0;chunk-signature={sigs[2]}\r\n\r\n".encode()
    )


async def _decode(body: bytes) -> bytes:
    auth = verifier().verify("PUT", "/examplebucket/chunkObject.txt", "", headers(**STREAMING_HEADERS))
    reader = asyncio.StreamReader()
    reader.feed_data(body)
    reader.feed_eof()
    return b"".join([c async for c in body_stream(reader, auth, {})])


def test_streaming_signed_payload_example():
    body = _example_body(CHUNK_SIGS)
    assert len(body) == 66824
    assert asyncio.run(_decode(body)) == b"a" * 66560


def test_streaming_signed_payload_example_tampered_chunk():
    body = _example_body(CHUNK_SIGS).replace(b"a" * 1024 + b"\r\n0;", b"b" + b"a" * 1023 + b"\r\n0;")
    with pytest.raises(S3Error) as e:
        asyncio.run(_decode(body))
    assert e.value.code.name == "SignatureDoesNotMatch"
