"""Multipart uploads through boto3."""

from __future__ import annotations

import hashlib
import os

import pytest
from botocore.exceptions import ClientError
from rawhttp import signed

MiB = 1024 * 1024


def code(e) -> str:
    return e.value.response["Error"]["Code"]


def status(e) -> int:
    return e.value.response["ResponseMetadata"]["HTTPStatusCode"]


def multipart_etag(parts: list[bytes]) -> str:
    return f'"{hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()}-{len(parts)}"'


def upload(s3, bucket, key, parts, **create_kw):
    uid = s3.create_multipart_upload(Bucket=bucket, Key=key, **create_kw)["UploadId"]
    etags = [s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=i + 1, Body=p)["ETag"] for i, p in enumerate(parts)]
    return uid, etags


def test_full_multipart_cycle(s3, bucket):
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(1234)]
    uid, etags = upload(s3, bucket, "big", parts, Metadata={"kind": "mp"}, ContentType="application/x-mp")
    listed = s3.list_parts(Bucket=bucket, Key="big", UploadId=uid)
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in listed["Parts"]] == [(i + 1, len(p), e) for i, (p, e) in enumerate(zip(parts, etags))]
    assert [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=bucket)["Uploads"]] == [uid]
    done = s3.complete_multipart_upload(Bucket=bucket, Key="big", UploadId=uid,
                                        MultipartUpload={"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]})
    assert done["ETag"] == multipart_etag(parts)
    got = s3.get_object(Bucket=bucket, Key="big")
    assert got["Body"].read() == b"".join(parts)
    assert got["Metadata"] == {"kind": "mp"} and got["ContentType"] == "application/x-mp"
    assert "Uploads" not in s3.list_multipart_uploads(Bucket=bucket)


def test_get_and_head_by_part_number(s3, bucket):
    parts = [b"a" * 5 * MiB, b"b" * 3]
    uid, etags = upload(s3, bucket, "p", parts)
    s3.complete_multipart_upload(Bucket=bucket, Key="p", UploadId=uid,
                                 MultipartUpload={"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]})
    got = s3.get_object(Bucket=bucket, Key="p", PartNumber=2)
    assert got["Body"].read() == b"bbb" and got["PartsCount"] == 2
    head = s3.head_object(Bucket=bucket, Key="p", PartNumber=1)
    assert head["ContentLength"] == 5 * MiB and head["PartsCount"] == 2
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="p", PartNumber=3)
    assert code(e) == "InvalidPart" and status(e) == 400  # a part past the last is InvalidPart, not 416
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="p", PartNumber=3)
    assert status(e) == 400


def test_part_number_on_plain_object(s3, bucket):
    """An object uploaded whole has one part: part 1 is all of it, any other part is 400 InvalidPart."""
    s3.put_object(Bucket=bucket, Key="plain", Body=b"whole")
    got = s3.get_object(Bucket=bucket, Key="plain", PartNumber=1)
    assert got["Body"].read() == b"whole" and got["PartsCount"] == 1
    for n in (2, 10000):
        with pytest.raises(ClientError) as e:
            s3.get_object(Bucket=bucket, Key="plain", PartNumber=n)
        assert code(e) == "InvalidPart" and status(e) == 400
        with pytest.raises(ClientError) as e:
            s3.head_object(Bucket=bucket, Key="plain", PartNumber=n)
        assert status(e) == 400


@pytest.mark.parametrize("number", ["0", "10001", "-1", "one"])
def test_get_part_number_outside_1_to_10000_is_invalid_argument(server, tenants, s3, bucket, number):
    s3.put_object(Bucket=bucket, Key="plain", Body=b"whole")
    r = signed(server.endpoint, tenants["alice"], "GET", f"/{bucket}/plain?partNumber={number}")
    assert r.status == 400 and b"<Code>InvalidArgument</Code>" in r.body


def test_entity_too_small(s3, bucket):
    uid, etags = upload(s3, bucket, "small", [b"x" * 100, b"y" * 100])
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="small", UploadId=uid,
                                     MultipartUpload={"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]})
    assert code(e) == "EntityTooSmall"


def test_invalid_part_and_order(s3, bucket):
    uid, etags = upload(s3, bucket, "k", [b"x" * 5 * MiB, b"y"])
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=uid,
                                     MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"00000000000000000000000000000000"'}]})
    assert code(e) == "InvalidPart"
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=uid,
                                     MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": etags[1]}, {"PartNumber": 1, "ETag": etags[0]}]})
    assert code(e) == "InvalidPartOrder"
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=uid,
                                     MultipartUpload={"Parts": [{"PartNumber": 3, "ETag": etags[0]}]})
    assert code(e) == "InvalidPart"
    # A subset of parts (skipping 2) is a valid completion.
    s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=uid, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etags[0]}]})
    assert s3.head_object(Bucket=bucket, Key="k")["ContentLength"] == 5 * MiB


def test_abort(s3, bucket):
    uid, _ = upload(s3, bucket, "ab", [b"x"])
    s3.abort_multipart_upload(Bucket=bucket, Key="ab", UploadId=uid)
    with pytest.raises(ClientError) as e:
        s3.list_parts(Bucket=bucket, Key="ab", UploadId=uid)
    assert code(e) == "NoSuchUpload"
    with pytest.raises(ClientError) as e:
        s3.upload_part(Bucket=bucket, Key="ab", UploadId=uid, PartNumber=1, Body=b"x")
    assert code(e) == "NoSuchUpload"


def test_invalid_part_number(s3, bucket):
    uid, _ = upload(s3, bucket, "n", [])
    with pytest.raises(ClientError) as e:
        s3.upload_part(Bucket=bucket, Key="n", UploadId=uid, PartNumber=10001, Body=b"x")
    assert code(e) == "InvalidArgument"


def test_upload_part_copy_with_ranges(s3, bucket):
    src = os.urandom(12 * MiB)
    s3.put_object(Bucket=bucket, Key="src", Body=src)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="assembled")["UploadId"]
    r1 = s3.upload_part_copy(Bucket=bucket, Key="assembled", UploadId=uid, PartNumber=1,
                             CopySource={"Bucket": bucket, "Key": "src"}, CopySourceRange=f"bytes=0-{6 * MiB - 1}")
    r2 = s3.upload_part_copy(Bucket=bucket, Key="assembled", UploadId=uid, PartNumber=2,
                             CopySource={"Bucket": bucket, "Key": "src"}, CopySourceRange=f"bytes={10 * MiB}-{12 * MiB - 1}")
    assert r1["CopyPartResult"]["ETag"] == f'"{hashlib.md5(src[:6 * MiB]).hexdigest()}"'
    s3.complete_multipart_upload(Bucket=bucket, Key="assembled", UploadId=uid, MultipartUpload={"Parts": [
        {"PartNumber": 1, "ETag": r1["CopyPartResult"]["ETag"]}, {"PartNumber": 2, "ETag": r2["CopyPartResult"]["ETag"]}]})
    assert s3.get_object(Bucket=bucket, Key="assembled")["Body"].read() == src[: 6 * MiB] + src[10 * MiB :]
    uid = s3.create_multipart_upload(Bucket=bucket, Key="bad")["UploadId"]
    with pytest.raises(ClientError) as e:
        s3.upload_part_copy(Bucket=bucket, Key="bad", UploadId=uid, PartNumber=1,
                            CopySource={"Bucket": bucket, "Key": "src"}, CopySourceRange=f"bytes=0-{12 * MiB}")
    assert code(e) == "InvalidRange"


def test_multipart_with_checksums(s3, bucket):
    parts = [os.urandom(5 * MiB), os.urandom(10)]
    uid = s3.create_multipart_upload(Bucket=bucket, Key="ck", ChecksumAlgorithm="CRC32")["UploadId"]
    up = [s3.upload_part(Bucket=bucket, Key="ck", UploadId=uid, PartNumber=i + 1, Body=p, ChecksumAlgorithm="CRC32") for i, p in enumerate(parts)]
    listed = s3.list_parts(Bucket=bucket, Key="ck", UploadId=uid)["Parts"]
    assert [p["ChecksumCRC32"] for p in listed] == [u["ChecksumCRC32"] for u in up]
    done = s3.complete_multipart_upload(Bucket=bucket, Key="ck", UploadId=uid, MultipartUpload={"Parts": [
        {"PartNumber": i + 1, "ETag": u["ETag"], "ChecksumCRC32": u["ChecksumCRC32"]} for i, u in enumerate(up)]})
    assert done["ChecksumCRC32"].endswith("-2")
    assert s3.get_object(Bucket=bucket, Key="ck", ChecksumMode="ENABLED")["Body"].read() == b"".join(parts)


def test_list_multipart_uploads_prefix_and_pagination(s3, bucket):
    ids = {}
    for k in ["x/1", "x/2", "y/1"]:
        ids[k] = s3.create_multipart_upload(Bucket=bucket, Key=k)["UploadId"]
    r = s3.list_multipart_uploads(Bucket=bucket, Prefix="x/")
    assert [u["Key"] for u in r["Uploads"]] == ["x/1", "x/2"]
    r = s3.list_multipart_uploads(Bucket=bucket, MaxUploads=2)
    assert r["IsTruncated"] and len(r["Uploads"]) == 2
    r2 = s3.list_multipart_uploads(Bucket=bucket, KeyMarker=r["NextKeyMarker"], UploadIdMarker=r["NextUploadIdMarker"])
    assert [u["Key"] for u in r2["Uploads"]] == ["y/1"]
    r = s3.list_multipart_uploads(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["x/", "y/"]


def test_a_retried_complete_succeeds_again_with_the_same_result(s3, bucket):
    """aws-cli and boto3 retry a CompleteMultipartUpload whose response was lost."""
    upload = s3.create_multipart_upload(Bucket=bucket, Key="retried")["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key="retried", UploadId=upload, PartNumber=1, Body=b"only part")["ETag"]
    parts = {"Parts": [{"PartNumber": 1, "ETag": etag}]}
    first = s3.complete_multipart_upload(Bucket=bucket, Key="retried", UploadId=upload, MultipartUpload=parts)
    again = s3.complete_multipart_upload(Bucket=bucket, Key="retried", UploadId=upload, MultipartUpload=parts)
    assert again["ETag"] == first["ETag"] and again["Key"] == "retried"
    s3.put_object(Bucket=bucket, Key="retried", Body=b"overwritten since")  # the upload's object is gone now
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="retried", UploadId=upload, MultipartUpload=parts)
    assert e.value.response["Error"]["Code"] == "NoSuchUpload"


@pytest.mark.parametrize("algorithm,checksum_type", [
    ("CRC32", "COMPOSITE"), ("CRC32", "FULL_OBJECT"), ("CRC32C", "COMPOSITE"), ("CRC32C", "FULL_OBJECT"),
    ("CRC64NVME", "FULL_OBJECT"), ("SHA1", "COMPOSITE"), ("SHA256", "COMPOSITE"),
])
def test_complete_returns_the_checksum_of_the_type_the_upload_asked_for(s3, bucket, algorithm, checksum_type):
    """boto3's checksum helpers: COMPOSITE is a checksum of the parts' checksums ("-N"); FULL_OBJECT is the whole object's."""
    import base64

    from protocol.checksums import new_checksum

    key = f"{algorithm}-{checksum_type}"
    up = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm=algorithm, ChecksumType=checksum_type)["UploadId"]
    bodies = [b"a" * (5 << 20), b"tail"]
    parts = []
    for n, body in enumerate(bodies, 1):
        r = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=n, Body=body, ChecksumAlgorithm=algorithm)
        parts.append({"PartNumber": n, "ETag": r["ETag"], f"Checksum{algorithm}": r[f"Checksum{algorithm}"]})
    done = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up, MultipartUpload={"Parts": parts})
    value = done[f"Checksum{algorithm}"]
    if checksum_type == "FULL_OBJECT":
        whole = new_checksum(algorithm)
        whole.update(b"".join(bodies))
        assert value == base64.b64encode(whole.digest()).decode()
    else:
        assert value.endswith("-2")
    got = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    assert got[f"Checksum{algorithm}"] == value and got["ResponseMetadata"]["HTTPHeaders"]["x-amz-checksum-type"] == checksum_type


def test_a_checksum_type_an_algorithm_does_not_support_is_refused(s3, bucket):
    for algorithm, checksum_type in (("SHA256", "FULL_OBJECT"), ("CRC64NVME", "COMPOSITE")):
        with pytest.raises(ClientError) as e:
            s3.create_multipart_upload(Bucket=bucket, Key="k", ChecksumAlgorithm=algorithm, ChecksumType=checksum_type)
        assert e.value.response["Error"]["Code"] == "InvalidRequest"
