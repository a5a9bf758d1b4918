"""s3cmd (Debian's package, installed by `make test` like rclone) on ObjectCache: sync up and back (a multipart
file among them), setacl --acl-public / --acl-private as an anonymous reader sees them, ACL-preserving cp and mv,
signurl for plain HTTP, and info (which asks for the bucket policy)."""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

MiB = 1024 * 1024
S3CMD = shutil.which("s3cmd")
pytestmark = pytest.mark.skipif(S3CMD is None, reason="s3cmd is not installed: `make test` installs Debian's s3cmd (apt-get install s3cmd)")


@pytest.fixture
def s3cmd(server, tenants, tmp_path):
    t, host = tenants["alice"], server.endpoint.removeprefix("http://")
    cfg = tmp_path / "s3cfg"
    cfg.write_text(f"[default]\naccess_key = {t.access_key}\nsecret_key = {t.secret_key}\nhost_base = {host}\nhost_bucket = {host}\n"
                   "use_https = False\nbucket_location = us-east-1\nsignature_v2 = False\n")

    def run(*args: str) -> str:
        r = subprocess.run([S3CMD, "-c", str(cfg), "--no-progress", *args], capture_output=True, text=True, timeout=120,
                           env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)})
        assert r.returncode == 0, f"s3cmd {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
        return r.stdout

    return run


def anonymous(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_sync_up_and_back(s3cmd, s3, bucket, tmp_path):
    src = tmp_path / "src"
    for i in range(8):
        (src / f"d{i % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 2}" / f"f{i}.txt").write_bytes(f"line {i}\n".encode() * (i + 1))
    (src / "big.bin").write_bytes(os.urandom(12 * MiB))
    s3cmd("sync", "--multipart-chunk-size-mb=5", f"{src}/", f"s3://{bucket}/tree/")
    assert s3.head_object(Bucket=bucket, Key="tree/big.bin")["ETag"].endswith('-3"')  # 5 + 5 + 2 MiB
    (src / "d0" / "f0.txt").write_bytes(b"changed\n")
    out = s3cmd("sync", f"{src}/", f"s3://{bucket}/tree/")
    assert "d0/f0.txt" in out and "f1.txt" not in out  # only what changed goes up again
    back = tmp_path / "back"
    s3cmd("sync", f"s3://{bucket}/tree/", f"{back}/")
    assert tree(back) == tree(src)


def test_setacl_cp_mv_and_signurl(s3cmd, server, bucket, tmp_path):
    (tmp_path / "doc.txt").write_bytes(b"a public document")
    s3cmd("put", str(tmp_path / "doc.txt"), f"s3://{bucket}/doc.txt")
    url = f"{server.endpoint}/{bucket}"
    assert anonymous(f"{url}/doc.txt")[0] == 403
    s3cmd("setacl", "--acl-public", f"s3://{bucket}/doc.txt")  # GetObjectAcl, then PutObjectAcl with the edited policy
    assert anonymous(f"{url}/doc.txt") == (200, b"a public document")
    s3cmd("cp", f"s3://{bucket}/doc.txt", f"s3://{bucket}/copy.txt")  # keeps the source's ACL
    s3cmd("mv", f"s3://{bucket}/copy.txt", f"s3://{bucket}/moved.txt")
    assert anonymous(f"{url}/moved.txt") == (200, b"a public document")
    s3cmd("setacl", "--acl-private", f"s3://{bucket}/doc.txt")
    assert anonymous(f"{url}/doc.txt")[0] == 403
    signed = s3cmd("signurl", f"s3://{bucket}/doc.txt", "+300").strip()
    assert anonymous(signed) == (200, b"a public document")
    info = s3cmd("info", f"s3://{bucket}")
    assert "Policy:" in info and "none" in info.split("Policy:", 1)[1].splitlines()[0].lower()
