"""The stores ``bench peers`` runs beside ObjectCache, each a throwaway process tree on 127.0.0.1.

* **Mooncake Store** (PyPI ``mooncake-transfer-engine-non-cuda``): ``mooncake_master`` with its
  HTTP metadata server, and ``mooncake_client`` as the storage process that holds the memory
  segment (the TCP protocol; its binaries load libibverbs/libnl even without RDMA).
* **LMCache's server** (``python -m lmcache.v1.server``, what an ``lm://`` remote URL points at).
* **Redis** (Debian's ``redis-server``), no persistence.

Each ``start()`` raises :class:`PeerUnavailable` with the reason when the peer is not installed
or does not come up, so the benchmark can skip it and say why.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from objectcache.lifeline import spawn


class PeerUnavailable(RuntimeError):
    """The peer cannot run here; the message says why (shown in the report)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, log: Path, what: str, wait_s: float = 60) -> None:
    """Until ``port`` accepts a connection; the log's tail in the error when ``proc`` exits or time runs out."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
    raise PeerUnavailable(f"{what} did not start (exit {proc.poll()}): {tail.strip()}")


class Peer:
    """Processes started in their own sessions under a temporary directory, stopped together."""

    name = ""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"objectcache-bench-{self.name}-"))
        self.procs: list[subprocess.Popen] = []

    def spawn(self, argv: list[str], log_name: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
        log = self.root / log_name
        with open(log, "ab") as out:
            p = spawn(argv, stdout=out, stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True, env={**os.environ, **(env or {})})
        self.procs.append(p)
        return p, log

    def unavailable(self, why: str) -> PeerUnavailable:
        """Stop what was started, then the error to raise."""
        self.stop()
        return PeerUnavailable(why)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)


def mooncake_binary(name: str) -> str | None:
    """A Mooncake binary: beside the interpreter (the wheel's console script), in the package, or on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    try:
        import mooncake
    except ImportError:
        return shutil.which(name)
    inside = Path(mooncake.__file__).parent / name
    return str(inside) if inside.exists() else shutil.which(name)


class Mooncake(Peer):
    """``mooncake_master`` plus ``mooncake_client`` holding a ``segment_bytes`` segment; clients use :attr:`master` and :attr:`metadata`."""

    name = "mooncake"

    def start(self, segment_bytes: int) -> "Mooncake":
        try:
            import mooncake.store  # noqa: F401  (the Python client the benchmark uses)
        except ImportError as e:
            raise self.unavailable(f"Mooncake Store needs the mooncake-transfer-engine-non-cuda package (pip install '.[peers]'): {e}") from None
        master_bin, client_bin = mooncake_binary("mooncake_master"), mooncake_binary("mooncake_client")
        if not master_bin or not client_bin:
            raise self.unavailable("Mooncake Store's mooncake_master / mooncake_client binaries were not found")
        rpc, meta, metrics, client = (free_port() for _ in range(4))
        self.master, self.metadata, self.client_address = f"127.0.0.1:{rpc}", f"http://127.0.0.1:{meta}/metadata", f"127.0.0.1:{client}"
        p, log = self.spawn([master_bin, f"--rpc_port={rpc}", "--rpc_address=127.0.0.1", "--enable_http_metadata_server=true",
                             "--http_metadata_server_host=127.0.0.1", f"--http_metadata_server_port={meta}", f"--metrics_port={metrics}",
                             "--enable_metric_reporting=false"], "master.log")
        try:
            wait_port(rpc, p, log, "mooncake_master")
            wait_port(meta, p, log, "mooncake_master's metadata server")
            mib = max(64, -(-segment_bytes // (1 << 20)))
            p, log = self.spawn([client_bin, f"--global_segment_size={mib}MB", "--local_buffer_size=64MB", f"--master_server_address={self.master}",
                                 f"--metadata_server={self.metadata}", "--host=127.0.0.1", f"--port={client}", "--protocol=tcp"], "client.log")
            wait_port(client, p, log, "mooncake_client")
        except PeerUnavailable:
            self.stop()
            raise
        return self


class Redis(Peer):
    name = "redis"

    def start(self) -> "Redis":
        binary = shutil.which("redis-server")
        if importlib.util.find_spec("redis") is None:
            raise self.unavailable("Redis needs the redis package (pip install '.[peers]')")
        if binary is None:
            raise self.unavailable("Redis needs redis-server (Debian package redis-server; `make peers`)")
        self.port = free_port()
        p, log = self.spawn([binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
                             "--dir", str(self.root), "--proto-max-bulk-len", "1gb", "--client-output-buffer-limit", "normal 0 0 0"], "redis.log")
        try:
            wait_port(self.port, p, log, "redis-server")
        except PeerUnavailable:
            self.stop()
            raise
        return self


class LMCacheServer(Peer):
    name = "lmcache"

    def start(self) -> "LMCacheServer":
        if importlib.util.find_spec("lmcache") is None:
            raise self.unavailable("LMCache's server needs the lmcache package (the vllm extra)")
        self.port = free_port()
        # Its own modules (lmcache/v1/platform) must not shadow the standard library: run from the temporary directory.
        p, log = self.spawn([sys.executable, "-m", "lmcache.v1.server", "127.0.0.1", str(self.port), "cpu"], "lmcache.log",
                            env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")})
        try:
            wait_port(self.port, p, log, "LMCache server", wait_s=180)
        except PeerUnavailable:
            self.stop()
            raise
        return self
