"""Upstream S3 stores for the ``s3`` backend's tests: moto's server and SeaweedFS, real peer processes on 127.0.0.1.

Its request log (one werkzeug line per request) is how tests count what ObjectCache asks
the upstream. ``shared_moto()`` is one server for the whole session, reset per test.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from support import free_port

from bench.upstreams import SeaweedFS

KEYS = ("testing", "testing")  # moto accepts any credentials


class MotoServer:
    def __init__(self, log: Path, port: int = 0) -> None:
        self.log, self.port = log, port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, wait_s: float = 30) -> "MotoServer":
        env = {**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                         stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"moto server did not start:\n{self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None

    def reset(self) -> None:
        """Forget every bucket (moto's own API)."""
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"), timeout=10).close()

    def requests(self) -> list[str]:
        """Request lines logged so far (``"GET /bucket/key?... HTTP/1.1" 200``), moto's own API excluded."""
        lines = self.log.read_text(errors="replace").splitlines()
        return [ln.split('"', 2)[1] for ln in lines if ln.count('"') >= 2 and "HTTP/1.1" in ln and "/moto-api/" not in ln]

    def config(self) -> str:
        """The ``[store.s3]`` table that points a node at this server."""
        return (f'[store.s3]\nendpoint_url = "{self.endpoint}"\naccess_key = "{KEYS[0]}"\nsecret_key = "{KEYS[1]}"\n'
                "max_attempts = 2\nconnect_timeout_s = 1\nread_timeout_s = 10\n")


_shared: list[MotoServer] = []


def chunk_gets(moto: "MotoServer", bucket: str, since: int) -> list[str]:
    """Upstream GETs of ``bucket``'s chunk objects (not ObjectCache's records, not listings) logged after request ``since``."""
    return [r for r in moto.requests()[since:] if re.match(rf"GET /{bucket}/(?!\.objectcache)\S+ ", r)]


def shared_moto(log_dir: Path) -> MotoServer:
    """One moto server for the session (started on first use, stopped and its log removed at exit)."""
    if not _shared or _shared[0].proc is None or _shared[0].proc.poll() is not None:
        moto = MotoServer(log_dir / f"moto-{os.getpid()}-{time.monotonic_ns()}.log").start()
        _shared[:] = [moto]
        atexit.register(lambda: (moto.stop(), moto.log.unlink(missing_ok=True)))
    return _shared[0]


class WeedServer(SeaweedFS):
    """SeaweedFS as the benchmarks run it (``weed server`` plus a second volume server, so chunks spread
    over two volume servers as in a cluster; SIGKILL after a short SIGTERM grace), configured for tests."""

    def config(self) -> str:
        return (f'[store.s3]\nendpoint_url = "{self.endpoint}"\naccess_key = "{self.access_key}"\nsecret_key = "{self.secret_key}"\n'
                "max_attempts = 3\nconnect_timeout_s = 2\nread_timeout_s = 20\n")

    def reset(self) -> None:
        """Remove every bucket: SeaweedFS has no reset API, but deletes a bucket with its objects and open uploads
        in one call (a third of the time emptying it first took); one it refuses as not empty is emptied first."""
        from botocore.exceptions import ClientError

        s3 = self._s3
        for b in s3.list_buckets().get("Buckets", []):
            try:
                s3.delete_bucket(Bucket=b["Name"])
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") != "BucketNotEmpty":
                    raise
                self._empty(b["Name"])
                s3.delete_bucket(Bucket=b["Name"])

    def _empty(self, name: str) -> None:
        s3 = self._s3
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                s3.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
        for u in s3.list_multipart_uploads(Bucket=name).get("Uploads", []):
            s3.abort_multipart_upload(Bucket=name, Key=u["Key"], UploadId=u["UploadId"])

    @functools.cached_property
    def _s3(self):
        """A boto3 client of this server, made once (a reset runs before every test of the contract suites)."""
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
                            region_name="us-east-1", config=Config(s3={"addressing_style": "path"}))


_shared_weed: list[WeedServer] = []


def shared_weed() -> WeedServer:
    """One SeaweedFS for the session (started on first use, it takes seconds; stopped at exit). Each user keeps to
    buckets of its own, or empties it first with :meth:`WeedServer.reset` (SeaweedFS grows volumes per bucket:
    a user that accumulates buckets resets it at its start, as a server of its own would have started empty)."""
    if not _shared_weed or any(p.poll() is not None for p in _shared_weed[0].procs):
        weed = WeedServer().start()
        _shared_weed[:] = [weed]
        atexit.register(weed.stop)
    return _shared_weed[0]


def s3_backend_config(root: Path, upstream: MotoServer | WeedServer, tenants: list, name: str = "",
                      s3_extra: str = "", extra: str = "") -> Path:
    """An ``objectcache serve`` configuration on the ``s3`` backend over ``upstream``, with these tenants
    (:class:`support.TenantKeys`), its data directory and RPC socket under ``root`` (``name``'s own, for one of
    several nodes there); ``s3_extra`` goes into ``[store.s3]``, ``extra`` (whole tables) before ``[storage_server]``."""
    data, sock, path = ((root / f"{name}-data", root / f"{name}.sock", root / f"{name}.toml") if name else
                        (root / "data", root / "ss.sock", root / "s3-backend.toml"))
    text = (f'[store]\nbackend = "s3"\ndata_dir = "{data}"\n{upstream.config()}{s3_extra}{extra}'
            f'[storage_server]\nsocket = "{sock}"\n')
    text += "".join(f'[[tenants]]\nname = "{t.name}"\naccess_key = "{t.access_key}"\nsecret_key = "{t.secret_key}"\n' for t in tenants)
    path.write_text(text)
    return path
