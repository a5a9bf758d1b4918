"""The real ``rclone`` binary against the gateway: an S3 remote configured only by environment variables."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support import TenantKeys

RCLONE = shutil.which("rclone")
pytestmark = pytest.mark.skipif(RCLONE is None, reason="rclone is not installed and could not be (`make test` installs it "
                                "with apt-get as root; otherwise: sudo apt-get install rclone)")
MiB = 1024 * 1024


class Rclone:
    """``rclone`` with a remote ``oc:`` (S3, provider Other, path-style) pointed at the test server as one tenant."""

    def __init__(self, endpoint: str, tenant, home: Path) -> None:
        self.env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(home),
            "RCLONE_CONFIG": str(home / "rclone.conf"),  # none: the remote comes from the variables below
            "RCLONE_CONFIG_OC_TYPE": "s3",
            "RCLONE_CONFIG_OC_PROVIDER": "Other",
            "RCLONE_CONFIG_OC_ENDPOINT": endpoint,
            "RCLONE_CONFIG_OC_ACCESS_KEY_ID": tenant.access_key,
            "RCLONE_CONFIG_OC_SECRET_ACCESS_KEY": tenant.secret_key,
            "RCLONE_CONFIG_OC_REGION": "us-east-1",
            "RCLONE_CONFIG_OC_FORCE_PATH_STYLE": "true",
        }

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        argv = [RCLONE, "--retries", "1", "--low-level-retries", "1", "--contimeout", "10s", "--timeout", "60s", *args]
        r = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=300)
        if check and r.returncode != 0:
            raise AssertionError(f"rclone {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return r


@pytest.fixture(scope="module")
def rclone(server, tenants, tmp_path_factory) -> Rclone:
    return Rclone(server.endpoint, tenants["alice"], tmp_path_factory.mktemp("rclonehome"))


@pytest.fixture
def tree(tmp_path) -> Path:
    """A local directory: small files, a nested one, an empty file and one large enough for multipart."""
    root = tmp_path / "tree"
    files = {"a.txt": b"alpha\n", "sub/b.txt": b"bravo\n", "sub/deeper/c.bin": os.urandom(70_000), "empty": b"",
             "big.bin": os.urandom(6 * MiB + 5)}
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def keys(s3, bucket: str) -> dict[str, int]:
    return {o["Key"]: o["Size"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket) for o in page.get("Contents", [])}


def test_copy_up_check_and_copy_back_byte_identical(rclone, s3, bucket, tree, tmp_path):
    # A 5 MiB cutoff makes big.bin a multipart upload.
    rclone("copy", str(tree), f"oc:{bucket}/up", "--s3-upload-cutoff", "5M", "--s3-chunk-size", "5M")
    assert keys(s3, bucket) == {f"up/{p.relative_to(tree)}": p.stat().st_size for p in tree.rglob("*") if p.is_file()}
    assert s3.head_object(Bucket=bucket, Key="up/big.bin")["ETag"].endswith('-2"')
    # check compares sizes and hashes (MD5 for single-part objects; rclone keeps one in metadata for multipart).
    rclone("check", str(tree), f"oc:{bucket}/up")
    back = tmp_path / "back"
    rclone("copy", f"oc:{bucket}/up", str(back))
    for p in tree.rglob("*"):
        if p.is_file():
            assert (back / p.relative_to(tree)).read_bytes() == p.read_bytes(), p


def test_check_reports_a_difference(rclone, bucket, tree):
    rclone("copy", str(tree), f"oc:{bucket}/c")
    (tree / "a.txt").write_bytes(b"ALPHA\n")  # same size, other bytes
    r = rclone("check", str(tree), f"oc:{bucket}/c", check=False)
    assert r.returncode != 0 and "a.txt" in r.stderr and "1 differences found" in r.stderr


def test_ls_lsf_and_lsd(rclone, bucket, tree):
    rclone("copy", str(tree), f"oc:{bucket}/l")
    listed = {line.split(maxsplit=1)[1]: int(line.split()[0]) for line in rclone("ls", f"oc:{bucket}/l").stdout.splitlines()}
    assert listed == {str(p.relative_to(tree)): p.stat().st_size for p in tree.rglob("*") if p.is_file()}
    assert sorted(rclone("lsf", f"oc:{bucket}/l").stdout.split()) == ["a.txt", "big.bin", "empty", "sub/"]
    assert [line.split()[-1] for line in rclone("lsd", f"oc:{bucket}/l").stdout.splitlines()] == ["sub"]
    assert bucket in rclone("lsd", "oc:").stdout


def test_sync_mirrors_changes_and_deletions_and_a_second_run_copies_nothing(rclone, s3, bucket, tree):
    rclone("sync", str(tree), f"oc:{bucket}/s")
    (tree / "a.txt").write_bytes(b"alpha, changed\n")
    (tree / "sub" / "b.txt").unlink()
    (tree / "new.txt").write_bytes(b"new\n")
    rclone("sync", str(tree), f"oc:{bucket}/s")
    assert set(keys(s3, bucket)) == {"s/a.txt", "s/big.bin", "s/empty", "s/new.txt", "s/sub/deeper/c.bin"}
    assert s3.get_object(Bucket=bucket, Key="s/a.txt")["Body"].read() == b"alpha, changed\n"
    again = rclone("sync", str(tree), f"oc:{bucket}/s", "-v")
    assert "Copied" not in again.stderr and "Deleted" not in again.stderr, again.stderr
    rclone("check", str(tree), f"oc:{bucket}/s")


def test_delete_with_a_filter_and_deletefile(rclone, s3, bucket, tree):
    rclone("copy", str(tree), f"oc:{bucket}/d")
    rclone("delete", f"oc:{bucket}/d", "--include", "*.txt")
    assert set(keys(s3, bucket)) == {"d/big.bin", "d/empty", "d/sub/deeper/c.bin"}
    rclone("deletefile", f"oc:{bucket}/d/empty")
    assert set(keys(s3, bucket)) == {"d/big.bin", "d/sub/deeper/c.bin"}


def test_mkdir_and_purge_remove_a_whole_bucket(rclone, s3, tree):
    name = f"rclone-{os.urandom(6).hex()}"
    rclone("mkdir", f"oc:{name}")
    try:
        assert name in [b["Name"] for b in s3.list_buckets()["Buckets"]]
        rclone("copy", str(tree), f"oc:{name}")
        rclone("purge", f"oc:{name}/sub")  # a prefix: its objects only
        assert set(keys(s3, name)) == {"a.txt", "big.bin", "empty"}
        rclone("purge", f"oc:{name}")  # the bucket: its objects, then the bucket
        assert name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    finally:
        if name in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
            for k in keys(s3, name):
                s3.delete_object(Bucket=name, Key=k)
            s3.delete_bucket(Bucket=name)


def test_wrong_secret_is_refused(server, tenants, tmp_path):
    wrong = Rclone(server.endpoint, TenantKeys("x", tenants["alice"].access_key, "not-the-secret"), tmp_path)
    r = wrong("lsd", "oc:", check=False)
    assert r.returncode != 0 and "SignatureDoesNotMatch" in r.stderr
