"""Object operations through boto3: bytes, metadata, digests, ranges, conditions, copy, delete."""

from __future__ import annotations

import base64
import datetime
import hashlib
import os
import threading

import pytest
from botocore.exceptions import ClientError
from rawhttp import sign, signed


def code(e: pytest.ExceptionInfo) -> str:
    return e.value.response["Error"]["Code"]


def status(e: pytest.ExceptionInfo) -> int:
    return e.value.response["ResponseMetadata"]["HTTPStatusCode"]


def test_put_get_bytes_identical(s3, bucket):
    data = os.urandom(3 * 1024 * 1024 + 17)
    put = s3.put_object(Bucket=bucket, Key="blob.bin", Body=data)
    assert put["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    got = s3.get_object(Bucket=bucket, Key="blob.bin")
    assert got["Body"].read() == data
    assert got["ContentLength"] == len(data) and got["ETag"] == put["ETag"]


def test_empty_object_and_odd_keys(s3, bucket):
    keys = ["empty", "a/b/c", "sp ace", "plus+sign", "ünïcødé/ключ", "q?mark", "hash#tag", "pct%20", "trailing/", "new\nline", "cr\rlf"]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    for k in keys:
        assert s3.get_object(Bucket=bucket, Key=k)["Body"].read() == k.encode()
    s3.put_object(Bucket=bucket, Key="zero", Body=b"")
    assert s3.get_object(Bucket=bucket, Key="zero")["Body"].read() == b""


def test_metadata_and_system_headers_round_trip(s3, bucket):
    expires = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    s3.put_object(
        Bucket=bucket, Key="m", Body=b"x",
        Metadata={"plain": "value", "Mixed-Case": "v2"},
        ContentType="application/x-kv", CacheControl="max-age=60", ContentEncoding="gzip",
        ContentDisposition='attachment; filename="m.bin"', ContentLanguage="en", Expires=expires,
    )
    head = s3.head_object(Bucket=bucket, Key="m")
    assert head["Metadata"] == {"plain": "value", "mixed-case": "v2"}
    assert head["ContentType"] == "application/x-kv"
    assert head["CacheControl"] == "max-age=60"
    assert head["ContentEncoding"] == "gzip"
    assert head["ContentDisposition"] == 'attachment; filename="m.bin"'
    assert head["ContentLanguage"] == "en"
    assert head["Expires"] == expires


def test_non_ascii_metadata_comes_back_as_it_was_sent(server, tenants, s3, bucket):
    """Raw UTF-8 header bytes come back as the same raw bytes; an RFC 2047 encoded-word comes back as
    that word (encoded-words are used only where the client used them)."""
    from email.header import decode_header, make_header

    value = "größe ✓ 日本"
    word = "=?UTF-8?B?" + base64.b64encode(value.encode()).decode() + "?="
    s3.put_object(Bucket=bucket, Key="rfc2047", Body=b"x", Metadata={"label": word})
    returned = s3.head_object(Bucket=bucket, Key="rfc2047")["Metadata"]["label"]
    assert returned == word and str(make_header(decode_header(returned))) == value
    r = signed(server.endpoint, tenants["alice"], "PUT", f"/{bucket}/raw-utf8", headers={"x-amz-meta-label": value}, body=b"x")
    assert r.status == 200, r.body
    for method in ("HEAD", "GET"):
        r = signed(server.endpoint, tenants["alice"], method, f"/{bucket}/raw-utf8")
        raw = r.headers["x-amz-meta-label"].encode("latin-1")  # http.client reads header bytes as Latin-1
        assert r.status == 200 and raw == value.encode()


@pytest.mark.parametrize("encoding", ["deflate, gzip", "gzip,deflate", "br", "identity ,  gzip"])
def test_content_encoding_is_returned_exactly_as_sent(server, tenants, s3, bucket, encoding):
    s3.put_object(Bucket=bucket, Key="e", Body=b"x", ContentEncoding=encoding)
    assert s3.head_object(Bucket=bucket, Key="e")["ContentEncoding"] == encoding
    r = signed(server.endpoint, tenants["alice"], "GET", f"/{bucket}/e")
    assert r.status == 200 and r.headers["Content-Encoding"] == encoding and r.body == b"x"


def test_content_encoding_drops_only_aws_chunked(server, tenants, s3, bucket):
    """aws-chunked names this request's framing, not the object: stored without it, the rest as sent."""
    data = b"framed"
    body = f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n"
    headers = {"Content-Encoding": "aws-chunked, deflate, gzip", "x-amz-decoded-content-length": str(len(data)),
               "Content-Length": str(len(body))}
    r = signed(server.endpoint, tenants["alice"], "PUT", f"/{bucket}/e", headers=headers, body=body,
               payload_hash="STREAMING-UNSIGNED-PAYLOAD-TRAILER")
    assert r.status == 200, r.body
    got = s3.get_object(Bucket=bucket, Key="e")
    assert got["Body"].read() == data and got["ContentEncoding"] == "deflate, gzip"


@pytest.mark.parametrize("expect", ["200", "", "100-continue-please", "something"])
def test_put_with_an_unknown_expect_value_proceeds(server, tenants, s3, bucket, expect):
    """S3 ignores Expect values other than 100-continue on PUT: no 417, the object is stored."""
    r = signed(server.endpoint, tenants["alice"], "PUT", f"/{bucket}/x", headers={"Expect": expect}, body=b"expected")
    assert r.status == 200, r.body
    assert s3.get_object(Bucket=bucket, Key="x")["Body"].read() == b"expected"


def test_expect_100_continue_in_any_case_gets_the_interim_response(server, tenants, s3, bucket):
    """The client waits for 100 Continue before sending its body (http.client cannot, so read the wire)."""
    import socket

    h = sign(tenants["alice"], "PUT", f"{server.endpoint}/{bucket}/c", {"Expect": "100-Continue", "Content-Length": "4"}, b"body")
    h["Host"] = server.endpoint.split("//")[1]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        head = f"PUT /{bucket}/c HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
        sock.sendall(head.encode())
        assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(b"body")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    assert s3.get_object(Bucket=bucket, Key="c")["Body"].read() == b"body"


def test_default_content_type(s3, bucket):
    s3.put_object(Bucket=bucket, Key="d", Body=b"x")
    assert s3.head_object(Bucket=bucket, Key="d")["ContentType"] == "binary/octet-stream"


def test_content_md5(s3, bucket):
    data = b"md5 checked"
    good = base64.b64encode(hashlib.md5(data).digest()).decode()
    s3.put_object(Bucket=bucket, Key="ok", Body=data, ContentMD5=good)
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="bad", Body=data, ContentMD5=base64.b64encode(hashlib.md5(b"other").digest()).decode())
    assert code(e) == "BadDigest"
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="bad", Body=data, ContentMD5="not-base64!")
    assert code(e) == "InvalidDigest"
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="bad")


@pytest.mark.parametrize("algorithm", ["CRC32", "CRC32C", "SHA1", "SHA256", "CRC64NVME"])
def test_additional_checksums_verified_and_returned(s3, bucket, algorithm):
    data = os.urandom(100_000)
    put = s3.put_object(Bucket=bucket, Key="c", Body=data, ChecksumAlgorithm=algorithm)
    value = put[f"Checksum{algorithm}"]
    got = s3.get_object(Bucket=bucket, Key="c", ChecksumMode="ENABLED")
    assert got["Body"].read() == data
    assert got[f"Checksum{algorithm}"] == value
    head = s3.head_object(Bucket=bucket, Key="c", ChecksumMode="ENABLED")
    assert head[f"Checksum{algorithm}"] == value


def test_wrong_checksum_is_bad_digest(s3, bucket):
    wrong = base64.b64encode((123).to_bytes(4, "big")).decode()
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="c", Body=b"data", ChecksumCRC32=wrong)
    assert code(e) == "BadDigest"
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="c")


DIGEST_BYTES = {"CRC32": 4, "CRC32C": 4, "CRC64NVME": 8, "SHA1": 20, "SHA256": 32}


def wrong_checksum(algorithm: str) -> str:
    """A well-formed value for ``algorithm`` (base64 of a digest of the right length) that matches no body here."""
    return base64.b64encode(b"\x5a" * DIGEST_BYTES[algorithm]).decode()


@pytest.mark.parametrize("algorithm", sorted(DIGEST_BYTES))
def test_wrong_checksum_of_any_algorithm_is_bad_digest(server, tenants, s3, bucket, algorithm):
    """PutObject and UploadPart with a checksum that does not match the body: 400 BadDigest, nothing stored."""
    value = {f"Checksum{algorithm}": wrong_checksum(algorithm)}
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="c", Body=b"data", ChecksumAlgorithm=algorithm, **value)
    assert code(e) == "BadDigest" and status(e) == 400
    header = {f"x-amz-checksum-{algorithm.lower()}": wrong_checksum(algorithm)}
    r = signed(server.endpoint, tenants["alice"], "PUT", f"/{bucket}/c", headers=header, body=b"data")
    assert r.status == 400 and b"<Code>BadDigest</Code>" in r.body
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="c")
    uid = s3.create_multipart_upload(Bucket=bucket, Key="m", ChecksumAlgorithm=algorithm)["UploadId"]
    with pytest.raises(ClientError) as e:
        s3.upload_part(Bucket=bucket, Key="m", UploadId=uid, PartNumber=1, Body=b"data", ChecksumAlgorithm=algorithm, **value)
    assert code(e) == "BadDigest" and status(e) == 400
    r = signed(server.endpoint, tenants["alice"], "PUT", f"/{bucket}/m?partNumber=1&uploadId={uid}", headers=header, body=b"data")
    assert r.status == 400 and b"<Code>BadDigest</Code>" in r.body
    assert "Parts" not in s3.list_parts(Bucket=bucket, Key="m", UploadId=uid)
    s3.abort_multipart_upload(Bucket=bucket, Key="m", UploadId=uid)


@pytest.mark.parametrize("rng,expected", [("bytes=0-4", b"01234"), ("bytes=5-", b"56789"), ("bytes=-3", b"789"), ("bytes=8-100", b"89")])
def test_single_ranges(s3, bucket, rng, expected):
    s3.put_object(Bucket=bucket, Key="r", Body=b"0123456789")
    got = s3.get_object(Bucket=bucket, Key="r", Range=rng)
    assert got["Body"].read() == expected
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert got["ContentRange"].endswith("/10")


def test_unsatisfiable_range(s3, bucket):
    s3.put_object(Bucket=bucket, Key="r", Body=b"0123456789")
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="r", Range="bytes=10-20")
    assert code(e) == "InvalidRange" and status(e) == 416


def test_conditional_get(s3, bucket):
    etag = s3.put_object(Bucket=bucket, Key="c", Body=b"v1")["ETag"]
    past = datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc)
    future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
    assert s3.get_object(Bucket=bucket, Key="c", IfMatch=etag)["Body"].read() == b"v1"
    assert s3.get_object(Bucket=bucket, Key="c", IfModifiedSince=past)["Body"].read() == b"v1"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="c", IfMatch='"0000"')
    assert status(e) == 412 and code(e) == "PreconditionFailed"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="c", IfNoneMatch=etag)
    assert status(e) == 304
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="c", IfModifiedSince=future)
    assert status(e) == 304
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="c", IfUnmodifiedSince=past)
    assert status(e) == 412
    # If-Match that holds wins over a failing If-Unmodified-Since, as in S3.
    assert s3.get_object(Bucket=bucket, Key="c", IfMatch=etag, IfUnmodifiedSince=past)["Body"].read() == b"v1"
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="c", IfNoneMatch=etag)
    assert status(e) == 304


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_not_modified_carries_etag_and_last_modified(server, tenants, s3, bucket, method):
    """A 304 names the representation the client already has: its ETag and Last-Modified, and no body."""
    etag = s3.put_object(Bucket=bucket, Key="c", Body=b"v1")["ETag"]
    last_modified = s3.head_object(Bucket=bucket, Key="c")["ResponseMetadata"]["HTTPHeaders"]["last-modified"]
    for condition in ({"If-None-Match": etag}, {"If-Modified-Since": last_modified}):
        r = signed(server.endpoint, tenants["alice"], method, f"/{bucket}/c", headers=condition)
        assert r.status == 304 and r.body == b""
        assert r.headers["ETag"] == etag and r.headers["Last-Modified"] == last_modified
        assert r.headers["x-amz-request-id"]


def test_response_header_overrides(s3, bucket):
    s3.put_object(Bucket=bucket, Key="o", Body=b"x", ContentType="text/plain")
    got = s3.get_object(
        Bucket=bucket, Key="o", ResponseContentType="application/json", ResponseContentDisposition="inline",
        ResponseCacheControl="no-cache", ResponseContentLanguage="fr", ResponseContentEncoding="identity",
        ResponseExpires=datetime.datetime(2031, 1, 1, tzinfo=datetime.timezone.utc),
    )
    assert got["ContentType"] == "application/json"
    assert got["ContentDisposition"] == "inline"
    assert got["CacheControl"] == "no-cache"
    assert got["ContentLanguage"] == "fr"
    assert got["ContentEncoding"] == "identity"
    assert got["Expires"].year == 2031


def test_head_and_errors(s3, bucket):
    s3.put_object(Bucket=bucket, Key="h", Body=b"12345")
    head = s3.head_object(Bucket=bucket, Key="h")
    assert head["ContentLength"] == 5 and head["AcceptRanges"] == "bytes"
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="missing")
    assert status(e) == 404
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="missing")
    assert code(e) == "NoSuchKey"
    assert e.value.response["Error"].get("Key") == "missing"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="no-such-bucket-here", Key="k")
    assert code(e) == "NoSuchBucket"
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="k" * 1025, Body=b"x")
    assert code(e) == "KeyTooLongError"


def test_put_without_content_length_is_411(server, tenants, bucket):
    r = signed(server.endpoint, tenants["alice"], "PUT", f"/{bucket}/nolen", payload_hash="UNSIGNED-PAYLOAD")
    assert r.status == 411 and b"MissingContentLength" in r.body


def test_delete_object(s3, bucket):
    s3.put_object(Bucket=bucket, Key="d", Body=b"x")
    assert s3.delete_object(Bucket=bucket, Key="d")["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert s3.delete_object(Bucket=bucket, Key="d")["ResponseMetadata"]["HTTPStatusCode"] == 204  # idempotent
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="d")


def test_overwrite_replaces(s3, bucket):
    s3.put_object(Bucket=bucket, Key="o", Body=b"first", Metadata={"v": "1"})
    s3.put_object(Bucket=bucket, Key="o", Body=b"second")
    got = s3.get_object(Bucket=bucket, Key="o")
    assert got["Body"].read() == b"second" and got["Metadata"] == {}


@pytest.mark.parametrize("sizes", [(1000, 3000), (100_000, 300_000)], ids=["prefetched", "streamed"])
def test_get_during_overwrites_returns_one_version_whole(s3, bucket, sizes):
    """A GET racing overwrites answers with one version's headers and that version's bytes, never a mix.

    First one overlap made certain by the order of events: a GET has begun (headers and its first byte
    read) when a whole overwrite starts and is acknowledged, and only then is the rest of its body read.
    Then GETs against a writer overwriting in a loop."""
    versions = {f'"{hashlib.md5(b).hexdigest()}"': b for b in (b"a" * sizes[0], b"b" * sizes[1])}
    bodies = list(versions.values())
    big = bytes(range(256)) * (16 << 12)  # 16 MiB: more than the connection can buffer ahead of the reader
    s3.put_object(Bucket=bucket, Key="racing", Body=big)
    got = s3.get_object(Bucket=bucket, Key="racing")
    first = got["Body"].read(1)
    s3.put_object(Bucket=bucket, Key="racing", Body=bodies[0])  # complete while that GET is mid-body
    assert s3.get_object(Bucket=bucket, Key="racing")["Body"].read() == bodies[0]
    assert first + got["Body"].read() == big and got["ETag"] == f'"{hashlib.md5(big).hexdigest()}"'
    stop = threading.Event()

    def overwrite() -> None:
        i = 0
        while not stop.is_set() and i < 2000:
            i += 1
            s3.put_object(Bucket=bucket, Key="racing", Body=bodies[i % 2])

    writer = threading.Thread(target=overwrite)
    writer.start()
    try:
        for _ in range(150):
            got = s3.get_object(Bucket=bucket, Key="racing")
            body = got["Body"].read()
            assert versions.get(got["ETag"]) == body and got["ContentLength"] == len(body)
    finally:
        stop.set()
        writer.join()


def test_delete_objects(s3, bucket):
    for i in range(5):
        s3.put_object(Bucket=bucket, Key=f"k{i}", Body=b"x")
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "k0"}, {"Key": "k1"}, {"Key": "never-existed"}]})
    assert sorted(d["Key"] for d in r["Deleted"]) == ["k0", "k1", "never-existed"]
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "k2"}], "Quiet": True})
    assert "Deleted" not in r and "Errors" not in r
    left = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert left == ["k3", "k4"]


def test_delete_objects_limit(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": f"k{i}"} for i in range(1001)]})
    assert code(e) == "MalformedXML"


def test_copy_object_copy_and_replace(s3, bucket):
    s3.put_object(Bucket=bucket, Key="src", Body=b"payload", Metadata={"a": "1"}, ContentType="text/x-src")
    r = s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"})
    assert r["CopyObjectResult"]["ETag"] == s3.head_object(Bucket=bucket, Key="src")["ETag"]
    head = s3.head_object(Bucket=bucket, Key="dst")
    assert head["Metadata"] == {"a": "1"} and head["ContentType"] == "text/x-src"
    s3.copy_object(Bucket=bucket, Key="dst2", CopySource={"Bucket": bucket, "Key": "src"}, MetadataDirective="REPLACE",
                   Metadata={"b": "2"}, ContentType="text/x-new")
    head = s3.head_object(Bucket=bucket, Key="dst2")
    assert head["Metadata"] == {"b": "2"} and head["ContentType"] == "text/x-new"
    assert s3.get_object(Bucket=bucket, Key="dst2")["Body"].read() == b"payload"


def test_copy_onto_itself(s3, bucket):
    s3.put_object(Bucket=bucket, Key="self", Body=b"same", Metadata={"v": "1"})
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=bucket, Key="self", CopySource={"Bucket": bucket, "Key": "self"})
    assert code(e) == "InvalidRequest"
    s3.copy_object(Bucket=bucket, Key="self", CopySource={"Bucket": bucket, "Key": "self"}, MetadataDirective="REPLACE", Metadata={"v": "2"})
    got = s3.get_object(Bucket=bucket, Key="self")
    assert got["Metadata"] == {"v": "2"} and got["Body"].read() == b"same"


def test_copy_conditions(s3, bucket):
    etag = s3.put_object(Bucket=bucket, Key="src", Body=b"x")["ETag"]
    s3.copy_object(Bucket=bucket, Key="ok", CopySource={"Bucket": bucket, "Key": "src"}, CopySourceIfMatch=etag)
    for kw in ({"CopySourceIfMatch": '"nope"'}, {"CopySourceIfNoneMatch": etag},
               {"CopySourceIfUnmodifiedSince": datetime.datetime(2000, 1, 1)},
               {"CopySourceIfModifiedSince": datetime.datetime.now() + datetime.timedelta(days=1)}):
        with pytest.raises(ClientError) as e:
            s3.copy_object(Bucket=bucket, Key="no", CopySource={"Bucket": bucket, "Key": "src"}, **kw)
        assert code(e) == "PreconditionFailed", kw


def test_copy_missing_source_and_cross_tenant(s3, s3_bob, bucket):
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "absent"})
    assert code(e) == "NoSuchKey"
    s3.put_object(Bucket=bucket, Key="private", Body=b"x")
    bobs = f"{bucket}-bob"
    s3_bob.create_bucket(Bucket=bobs)
    try:
        with pytest.raises(ClientError) as e:
            s3_bob.copy_object(Bucket=bobs, Key="stolen", CopySource={"Bucket": bucket, "Key": "private"})
        assert code(e) == "AccessDenied"
    finally:
        s3_bob.delete_bucket(Bucket=bobs)
