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


def add_bench_parser(sub, name: str, help: str, run):
    """A benchmark subcommand with the options every benchmark has (``--quick``, ``--json``)."""
    p = sub.add_parser(name, help=help)
    p.add_argument("--quick", action="store_true", help="a tiny run (the smoke test in `make test`)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.set_defaults(bench=run)
    return p


def print_table(headers: list[str], rows: list[list[object]]) -> None:
    """A Markdown table on stdout."""
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
