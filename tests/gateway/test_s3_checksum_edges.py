"""Checksum edges an outside S3 conformance run found (issue 23 item 10)."""

from __future__ import annotations

import base64
import uuid

import pytest
from botocore.exceptions import ClientError
from botocore.httpchecksum import CrtCrc32cChecksum, CrtCrc32Checksum, CrtCrc64NvmeChecksum, Sha1Checksum, Sha256Checksum
from rawhttp import signed

HELPERS = {"CRC32": CrtCrc32Checksum, "CRC32C": CrtCrc32cChecksum, "CRC64NVME": CrtCrc64NvmeChecksum,
           "SHA1": Sha1Checksum, "SHA256": Sha256Checksum}
PART = 5 * 1024 * 1024


def _b64(alg: str, data: bytes) -> str:
    c = HELPERS[alg]()
    c.update(data)
    return base64.b64encode(c.digest()).decode()


def _composite(alg: str, parts: list[bytes]) -> str:
    c = HELPERS[alg]()
    for p in parts:
        c.update(base64.b64decode(_b64(alg, p)))
    return f"{base64.b64encode(c.digest()).decode()}-{len(parts)}"


@pytest.mark.parametrize("header", ["x-amz-checksum-crc32", "x-amz-checksum-sha256"])
@pytest.mark.parametrize("value", ["not base64!", "AAAA", ""])
def test_a_malformed_checksum_value_is_bad_digest_on_put_and_upload_part(server, tenants, s3, bucket, header, value):
    alice = tenants["alice"]
    r = signed(server.endpoint, alice, "PUT", f"/{bucket}/k", headers={header: value}, body=b"data")
    assert r.status == 400 and b"<Code>BadDigest</Code>" in r.body, r.body
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp")
    r = signed(server.endpoint, alice, "PUT", f"/{bucket}/mp?partNumber=1&uploadId={up['UploadId']}", headers={header: value}, body=b"data")
    assert r.status == 400 and b"<Code>BadDigest</Code>" in r.body, r.body


CASES = [(a, "COMPOSITE") for a in ("CRC32", "CRC32C", "SHA1", "SHA256")] + [(a, "FULL_OBJECT") for a in ("CRC32", "CRC32C", "CRC64NVME")]


@pytest.mark.parametrize("alg,ctype", CASES, ids=[f"{a}-{t}" for a, t in CASES])
def test_multipart_with_part_checksums_completes_with_the_value_the_client_computed(s3, bucket, alg, ctype):
    key = f"mp-{uuid.uuid4().hex[:8]}"
    parts = [b"a" * PART, b"tail bytes"]
    up = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm=alg, ChecksumType=ctype)
    done = []
    for n, data in enumerate(parts, 1):
        r = s3.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=n, Body=data, ChecksumAlgorithm=alg)
        assert r[f"Checksum{alg}"] == _b64(alg, data)
        done.append({"PartNumber": n, "ETag": r["ETag"], f"Checksum{alg}": r[f"Checksum{alg}"]})
    whole = _composite(alg, parts) if ctype == "COMPOSITE" else _b64(alg, b"".join(parts))
    r = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up["UploadId"], MultipartUpload={"Parts": done},
                                     ChecksumType=ctype, MpuObjectSize=sum(map(len, parts)), **{f"Checksum{alg}": whole})
    assert r[f"Checksum{alg}"] == whole
    head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    assert head[f"Checksum{alg}"] == whole and head["ChecksumType"] == ctype


def test_a_complete_whose_whole_object_value_does_not_match_is_bad_digest(s3, bucket):
    key = "mp-wrong"
    parts = [b"b" * PART, b"end"]
    up = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32", ChecksumType="FULL_OBJECT")
    done = [{"PartNumber": n, "ETag": s3.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=n, Body=d,
                                                     ChecksumAlgorithm="CRC32")["ETag"]} for n, d in enumerate(parts, 1)]
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up["UploadId"], MultipartUpload={"Parts": done},
                                     ChecksumType="FULL_OBJECT", ChecksumCRC32=_b64("CRC32", b"other bytes"))
    assert e.value.response["Error"]["Code"] == "BadDigest"
