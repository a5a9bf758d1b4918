"""Test support: real ObjectCache processes on 127.0.0.1 and clients for them."""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import boto3
from botocore.config import Config as BotoConfig

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class TenantKeys:
    name: str
    access_key: str
    secret_key: str


def make_tenants(*names: str) -> list[TenantKeys]:
    return [TenantKeys(n, "AK" + secrets.token_hex(8).upper(), secrets.token_urlsafe(24)) for n in names]


def write_config(path: Path, data_dir: Path, tenants: list[TenantKeys], extra: str = "") -> Path:
    lines = [f'[store]\ndata_dir = "{data_dir}"\n']
    for t in tenants:
        lines.append(f'[[tenants]]\nname = "{t.name}"\naccess_key = "{t.access_key}"\nsecret_key = "{t.secret_key}"\n')
    path.write_text("\n".join(lines) + extra)
    return path


class ServerProcess:
    """``objectcache serve`` (or one part) as a child process on a free port."""

    def __init__(self, config: Path, command: str = "serve", env: dict[str, str] | None = None,
                 preexec_fn: Callable[[], None] | None = None) -> None:
        """``preexec_fn`` runs in the child before it starts (e.g. to lower its resource limits)."""
        self.config, self.command, self.preexec_fn = config, command, preexec_fn
        self.env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.endpoint = ""
        self.output: list[str] = []
        self.rpc_socket = ""

    def start(self, port: int = 0) -> "ServerProcess":
        argv = [sys.executable, "-m", "objectcache", self.command, "--config", str(self.config)]
        if self.command != "storage-server":
            argv += ["--port", str(port)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env, cwd=REPO,
                                     start_new_session=True, preexec_fn=self.preexec_fn)
        assert self.proc.stdout is not None
        ready = "Press Ctrl-C" if self.command == "serve" else "READY"
        for line in self.proc.stdout:
            self.output.append(line)
            if "endpoint:" in line:
                self.endpoint = line.split("endpoint:", 1)[1].strip()
            if line.startswith("READY gateway"):
                self.endpoint = line.split()[2]
            if line.startswith(ready):
                break
        else:
            raise RuntimeError("server exited before it was ready:\n" + "".join(self.output))
        # Keep draining output so the child never blocks on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()
        return self

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
        return self.proc.wait(timeout=30)

    def kill(self) -> None:
        """SIGKILL the whole process group: no cleanup runs, like a crash."""
        self.stop(signal.SIGKILL)


def start_together(servers: Sequence[ServerProcess]) -> list[ServerProcess]:
    """Start ``servers`` side by side, returning them once each is ready (each start mostly waits on its child's
    imports and READY line: three cluster nodes one after another took three start-ups). If any fails, the ones
    that started are stopped and the first failure is raised."""
    with ThreadPoolExecutor(max(1, len(servers))) as pool:
        futures = [pool.submit(s.start) for s in servers]
    failures = [f.exception() for f in futures if f.exception() is not None]
    if failures:
        for s, f in zip(servers, futures):
            if f.exception() is None:
                s.stop()
        raise failures[0]
    return list(servers)


def boto_client(endpoint: str, tenant: TenantKeys, **config):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=tenant.access_key,
        aws_secret_access_key=tenant.secret_key,
        region_name="us-east-1",
        config=BotoConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, **config),
    )


@contextlib.contextmanager
def serving(tmp_path: Path, **storage_server: object) -> Iterator[tuple[ServerProcess, TenantKeys, Path]]:
    """``objectcache serve`` with one tenant and these ``[storage_server]`` settings; yields (server, tenant, RPC socket)."""
    tenant = make_tenants("t")[0]
    sock = tmp_path / "ss.sock"
    settings = "".join(f"{k} = {json.dumps(v)}\n" for k, v in storage_server.items())  # JSON scalars are TOML scalars
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra=f'\n[storage_server]\nsocket = "{sock}"\n{settings}')
    proc = ServerProcess(config).start()
    try:
        yield proc, tenant, sock
    finally:
        proc.stop()


@contextlib.contextmanager
def split_serving(tmp_path: Path, extra: str = "") -> Iterator[tuple[ServerProcess, ServerProcess, TenantKeys]]:
    """A storage server and a gateway as separate processes (as under systemd), one tenant, the
    RPC socket under ``tmp_path`` and ``extra`` lines of ``[storage_server]``; yields (storage, gateway, tenant).
    The storage server can be stopped and started again on its own."""
    tenant = make_tenants("t")[0]
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant],
                          extra=f'\n[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\n{extra}')
    storage = ServerProcess(config, command="storage-server").start()
    try:
        gateway = ServerProcess(config, command="gateway").start()
        try:
            yield storage, gateway, tenant
        finally:
            gateway.stop()
    finally:
        if storage.proc.poll() is None:
            storage.stop()


_GIVEN: set[int] = set()


def free_port() -> int:
    """A port for a server that a test starts on a fixed port (a metrics listener, moto).

    ``bind(0)`` then close is racy under pytest-xdist: the kernel may hand the same port to
    another worker's ``bind(0)`` or connection before the server binds it. These ports come
    from below the kernel's ephemeral range (never handed out by ``bind(0)`` or ``connect``),
    from a slice of it that is this worker's alone, never twice in one process, and are
    checked free by binding them.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    slot = int(worker[2:]) % 8 if worker[2:].isdigit() else 0
    low = 20000 + slot * 1500
    for _ in range(500):
        port = random.randrange(low, low + 1500)
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    raise RuntimeError(f"no free port in {low}..{low + 1500} for {worker}")
