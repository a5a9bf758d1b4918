"""The real aws-cli against the gateway: high-level `aws s3` and `aws s3api` commands."""

from __future__ import annotations

import base64
import filecmp
import hashlib
import json
import os
import urllib.request

import pytest

MiB = 1024 * 1024


@pytest.fixture
def cli_bucket(aws, s3):
    name = f"cli-{os.urandom(6).hex()}"
    aws("s3", "mb", f"s3://{name}")
    yield name
    aws("s3", "rb", f"s3://{name}", "--force")


def test_mb_ls_rb(aws, s3):
    name = f"cli-{os.urandom(6).hex()}"
    out = aws("s3", "mb", f"s3://{name}").stdout.decode()
    assert f"make_bucket: {name}" in out
    assert name in aws("s3", "ls").stdout.decode()
    aws("s3", "rb", f"s3://{name}")
    assert name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


@pytest.mark.parametrize("size", [1000, 21 * MiB + 123], ids=["small", "multipart"])
def test_cp_both_directions_byte_identical(aws, s3, cli_bucket, tmp_path, size):
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(size))
    aws("s3", "cp", str(src), f"s3://{cli_bucket}/dir/obj.bin")
    etag = s3.head_object(Bucket=cli_bucket, Key="dir/obj.bin")["ETag"]
    if size > 8 * MiB:
        assert etag.endswith('-3"'), "aws-cli should have used multipart (8 MiB parts)"
    dst = tmp_path / "dst.bin"
    aws("s3", "cp", f"s3://{cli_bucket}/dir/obj.bin", str(dst))
    assert hashlib.sha256(dst.read_bytes()).digest() == hashlib.sha256(src.read_bytes()).digest()


def test_sync_twice_copies_nothing_the_second_time(aws, cli_bucket, tmp_path):
    tree = tmp_path / "tree"
    for rel in ["a.txt", "sub/b.txt", "sub/deeper/c.bin"]:
        p = tree / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(2048))
    first = aws("s3", "sync", str(tree), f"s3://{cli_bucket}/tree").stdout.decode()
    assert first.count("upload:") == 3
    second = aws("s3", "sync", str(tree), f"s3://{cli_bucket}/tree").stdout.decode()
    assert "upload:" not in second
    back = tmp_path / "back"
    aws("s3", "sync", f"s3://{cli_bucket}/tree", str(back))
    assert not filecmp.dircmp(tree, back).diff_files
    assert sorted(p.relative_to(back).as_posix() for p in back.rglob("*") if p.is_file()) == ["a.txt", "sub/b.txt", "sub/deeper/c.bin"]


def test_ls_recursive_and_rm_recursive(aws, s3, cli_bucket):
    for k in ["x/1", "x/y/2", "z"]:
        s3.put_object(Bucket=cli_bucket, Key=k, Body=b"data")
    listing = aws("s3", "ls", "--recursive", f"s3://{cli_bucket}").stdout.decode()
    assert [line.split()[-1] for line in listing.strip().splitlines()] == ["x/1", "x/y/2", "z"]
    top = aws("s3", "ls", f"s3://{cli_bucket}/").stdout.decode()
    assert "PRE x/" in top and top.strip().splitlines()[-1].endswith(" z")
    aws("s3", "rm", "--recursive", f"s3://{cli_bucket}/x")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=cli_bucket)["Contents"]] == ["z"]


def test_presign_url_downloads_with_plain_http(aws, s3, cli_bucket):
    s3.put_object(Bucket=cli_bucket, Key="shared file.txt", Body=b"via presign")
    url = aws("s3", "presign", f"s3://{cli_bucket}/shared file.txt", "--expires-in", "120").stdout.decode().strip()
    with urllib.request.urlopen(url) as resp:
        assert resp.read() == b"via presign"


def api(aws, *args) -> dict:
    out = aws("s3api", *args, "--output", "json").stdout.decode()
    return json.loads(out) if out.strip() else {}


def test_s3api_put_get_head_copy(aws, cli_bucket, tmp_path):
    body = tmp_path / "body.txt"
    body.write_bytes(b"0123456789abcdef")
    api(aws, "put-object", "--bucket", cli_bucket, "--key", "k", "--body", str(body),
        "--metadata", "owner=cli,purpose=test", "--content-type", "text/plain")
    out = tmp_path / "range.out"
    got = api(aws, "get-object", "--bucket", cli_bucket, "--key", "k", "--range", "bytes=2-5", str(out))
    assert out.read_bytes() == b"2345" and got["ContentRange"] == "bytes 2-5/16"
    head = api(aws, "head-object", "--bucket", cli_bucket, "--key", "k")
    assert head["Metadata"] == {"owner": "cli", "purpose": "test"} and head["ContentLength"] == 16
    api(aws, "copy-object", "--bucket", cli_bucket, "--key", "k2", "--copy-source", f"{cli_bucket}/k")
    assert api(aws, "head-object", "--bucket", cli_bucket, "--key", "k2")["ETag"] == head["ETag"]


def test_s3api_list_objects_v2_with_delimiter(aws, s3, cli_bucket):
    for k in ["logs/2026/a", "logs/2026/b", "logs/2025/c", "readme"]:
        s3.put_object(Bucket=cli_bucket, Key=k, Body=b"x")
    r = api(aws, "list-objects-v2", "--bucket", cli_bucket, "--prefix", "logs/", "--delimiter", "/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["logs/2025/", "logs/2026/"]
    assert "Contents" not in r


def test_s3api_multipart_create_upload_list_complete_abort(aws, s3, cli_bucket, tmp_path):
    part1, part2 = tmp_path / "p1", tmp_path / "p2"
    part1.write_bytes(os.urandom(5 * MiB))
    part2.write_bytes(os.urandom(1000))
    uid = api(aws, "create-multipart-upload", "--bucket", cli_bucket, "--key", "mp")["UploadId"]
    e1 = api(aws, "upload-part", "--bucket", cli_bucket, "--key", "mp", "--upload-id", uid, "--part-number", "1", "--body", str(part1))["ETag"]
    e2 = api(aws, "upload-part", "--bucket", cli_bucket, "--key", "mp", "--upload-id", uid, "--part-number", "2", "--body", str(part2))["ETag"]
    parts = api(aws, "list-parts", "--bucket", cli_bucket, "--key", "mp", "--upload-id", uid)["Parts"]
    assert [(p["PartNumber"], p["ETag"]) for p in parts] == [(1, e1), (2, e2)]
    spec = tmp_path / "parts.json"
    spec.write_text(json.dumps({"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]}))
    done = api(aws, "complete-multipart-upload", "--bucket", cli_bucket, "--key", "mp", "--upload-id", uid,
               "--multipart-upload", f"file://{spec}")
    assert done["ETag"].endswith('-2"')
    assert s3.get_object(Bucket=cli_bucket, Key="mp")["Body"].read() == part1.read_bytes() + part2.read_bytes()
    uid2 = api(aws, "create-multipart-upload", "--bucket", cli_bucket, "--key", "gone")["UploadId"]
    api(aws, "abort-multipart-upload", "--bucket", cli_bucket, "--key", "gone", "--upload-id", uid2)
    uploads = api(aws, "list-multipart-uploads", "--bucket", cli_bucket).get("Uploads", [])
    assert uid2 not in [u["UploadId"] for u in uploads]


def test_s3api_delete_objects(aws, s3, cli_bucket, tmp_path):
    for k in ["d1", "d2", "keep"]:
        s3.put_object(Bucket=cli_bucket, Key=k, Body=b"x")
    spec = tmp_path / "delete.json"
    spec.write_text(json.dumps({"Objects": [{"Key": "d1"}, {"Key": "d2"}], "Quiet": False}))
    r = api(aws, "delete-objects", "--bucket", cli_bucket, "--delete", f"file://{spec}")
    assert sorted(d["Key"] for d in r["Deleted"]) == ["d1", "d2"]
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=cli_bucket)["Contents"]] == ["keep"]


def test_cli_error_is_clear(aws, cli_bucket):
    r = aws("s3api", "head-object", "--bucket", cli_bucket, "--key", "absent", check=False)
    assert r.returncode != 0 and b"404" in r.stderr
    r = aws("s3api", "get-object", "--bucket", cli_bucket, "--key", "absent", "/dev/null", check=False)
    assert b"NoSuchKey" in r.stderr


def test_s3api_bucket_versioning_and_recreating_a_bucket(aws, cli_bucket):
    """get-bucket-versioning of a bucket never versioned prints no Status; put-bucket-versioning says it is
    not supported; create-bucket on your own us-east-1 bucket succeeds, as on S3."""
    assert "Status" not in api(aws, "get-bucket-versioning", "--bucket", cli_bucket)
    r = aws("s3api", "put-bucket-versioning", "--bucket", cli_bucket, "--versioning-configuration", "Status=Enabled", check=False)
    assert r.returncode != 0 and b"NotImplemented" in r.stderr and b"versioning is not supported" in r.stderr
    aws("s3api", "create-bucket", "--bucket", cli_bucket)
    assert aws("s3", "ls", f"s3://{cli_bucket}").returncode == 0


def test_s3api_put_object_with_a_wrong_checksum_is_bad_digest(aws, s3, cli_bucket, tmp_path):
    body = tmp_path / "body"
    body.write_bytes(b"checked bytes")
    wrong = base64.b64encode(b"\x5a" * 32).decode()
    r = aws("s3api", "put-object", "--bucket", cli_bucket, "--key", "k", "--body", str(body),
            "--checksum-algorithm", "SHA256", "--checksum-sha256", wrong, check=False)
    assert r.returncode != 0 and b"BadDigest" in r.stderr
    assert "Contents" not in s3.list_objects_v2(Bucket=cli_bucket)
