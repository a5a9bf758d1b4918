"""Shared benchmark plumbing: a throwaway ObjectCache server and result output."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass
class BenchServer:
    endpoint: str
    access_key: str
    secret_key: str
    proc: subprocess.Popen
    root: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)


def start_server(extra_toml: str = "") -> BenchServer:
    """``objectcache serve`` on a free port with one tenant, in a temporary data directory."""
    root = Path(tempfile.mkdtemp(prefix="objectcache-bench-"))
    ak, sk = "BENCH" + secrets.token_hex(6).upper(), secrets.token_urlsafe(24)
    cfg = root / "bench.toml"
    cfg.write_text(f'[store]\ndata_dir = "{root / "data"}"\n[[tenants]]\nname = "bench"\naccess_key = "{ak}"\nsecret_key = "{sk}"\n{extra_toml}')
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg), "--port", "0"],
                            stdout=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    endpoint = ""
    for line in proc.stdout:  # type: ignore[union-attr]
        if "endpoint:" in line:
            endpoint = line.split("endpoint:", 1)[1].strip()
        if line.startswith("Press Ctrl-C"):
            break
    if not endpoint:
        raise RuntimeError("benchmark server did not start")
    return BenchServer(endpoint, ak, sk, proc, root)


def emit(result: dict, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
