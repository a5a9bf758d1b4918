"""Shared benchmark plumbing: a throwaway ObjectCache server and result output."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from client_sdk import KVLayout
from objectcache.lifeline import spawn

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent


@dataclass
class BenchServer:
    endpoint: str
    access_key: str
    secret_key: str
    proc: subprocess.Popen
    root: Path
    env: dict[str, str] | None = None  # what start_server added to its environment (a restart keeps it)

    def stop(self, keep_data: bool = False) -> None:
        """Stop the server and (unless ``keep_data``, for a restart on the same store) delete its data."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        if not keep_data:
            shutil.rmtree(self.root, ignore_errors=True)

    def status(self) -> dict:
        """The storage server's operator status (its RPC socket under the data directory), e.g. ``chunk_cache``."""
        from protocol.rpc import Op, RpcRequest, decode_reply

        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(30)
            s.connect(str(self.root / "data" / "storage-server.sock"))
            s.sendall(RpcRequest(Op.STATUS).encode())
            return decode_reply(s.makefile("rb").readline())

    def restart(self, extra_toml: str = "", same_port: bool = False) -> "BenchServer":
        """The same store, credentials and environment under a new configuration (e.g. another bandwidth policy);
        ``same_port``: at the same endpoint, so clients of the old process carry on (they reconnect and re-register)."""
        self.stop(keep_data=True)
        port = int(self.endpoint.rsplit(":", 1)[1].split("/", 1)[0]) if same_port else 0
        return start_server(extra_toml, root=self.root, credentials=(self.access_key, self.secret_key), env=self.env, port=port)


def start_server(extra_toml: str = "", root: Path | None = None, credentials: tuple[str, str] | None = None,
                 env: dict[str, str] | None = None, store_toml: str = "", port: int = 0) -> BenchServer:
    """``objectcache serve`` on ``port`` (0: a free one) with one tenant, in a temporary data directory.

    ``env``: added to its environment; ``store_toml``: more lines of the ``[store]`` table (e.g. ``backend = "s3"``).
    """
    root = root or Path(tempfile.mkdtemp(prefix="objectcache-bench-"))
    ak, sk = credentials or ("BENCH" + secrets.token_hex(6).upper(), secrets.token_urlsafe(24))
    cfg = root / "bench.toml"
    cfg.write_text(f'[store]\ndata_dir = "{root / "data"}"\n{store_toml}[[tenants]]\nname = "bench"\naccess_key = "{ak}"\nsecret_key = "{sk}"\n{extra_toml}')
    proc = spawn([sys.executable, "-m", "objectcache", "serve", "--config", str(cfg), "--port", str(port)],
                 stdout=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True,
                 # No access log: one line per request would flood the benchmark's terminal (and cost time).
                 env={"OBJECTCACHE_LOG_ACCESS": "false", **os.environ, **(env or {}), "PYTHONPATH": str(REPO)})
    endpoint = ""
    for line in proc.stdout:  # type: ignore[union-attr]
        if "endpoint:" in line:
            endpoint = line.split("endpoint:", 1)[1].strip()
        if line.startswith("Press Ctrl-C"):
            break
    if not endpoint:
        raise RuntimeError("benchmark server did not start")
    # Keep reading: a server that prints (a restart notice, a warning) must never block on a full pipe.
    threading.Thread(target=lambda: [print(line, end="", file=sys.stderr) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    return BenchServer(endpoint, ak, sk, proc, root, env)


def grouped_bars(ax, groups: list[str], series: dict[str, list[float]], rotation: int = 30) -> None:
    """One bar per series in every group, side by side, named on the x axis (each plot's bar chart)."""
    width = 0.8 / len(series)
    for k, (name, values) in enumerate(series.items()):
        ax.bar([i + (k - (len(series) - 1) / 2) * width for i in range(len(groups))], values, width, label=name)
    ax.set_xticks(range(len(groups)), groups, rotation=rotation, ha="right" if rotation else "center")


def emit(result: dict, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=2)


def finish(args, result: dict, plot: Callable[[dict, Any], None] | None = None) -> dict:
    """Write ``--json`` and draw ``--plot`` (``plot(result, figure)`` fills a matplotlib figure)."""
    emit(result, args.json)
    if args.plot and plot is not None:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        from matplotlib.figure import Figure

        fig = Figure(figsize=(11, 6), layout="constrained")
        plot(result, fig)
        fig.savefig(args.plot, dpi=110)
        print(f"\nplot written to {args.plot}")
    return result


def progress(iterable: Iterable[T], total: int | None = None, desc: str = "") -> Iterator[T]:
    """A progress bar on stderr when it is a terminal; plain iteration otherwise (CI logs stay clean)."""
    from tqdm import tqdm

    return iter(tqdm(iterable, total=total, desc=desc, disable=None, leave=False, file=sys.stderr))


def power_of_two(text: str) -> int:
    """argparse type for ``--scale``: a power of two between 1 and 1024."""
    import argparse

    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1 or v > 1024 or v & (v - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two between 1 and 1024, not {text!r}")
    return v


def llama_layout(chunk_tokens: int, scale: int) -> KVLayout:
    """Llama 3.1 8B (32 layers, 4096 B per token per layer) with the bytes per token divided by ``scale``.

    ``scale`` must be a power of two ≤ 1024: it shrinks head_dim first, then the KV heads.
    """
    if scale < 1 or scale > 1024 or scale & (scale - 1):
        raise ValueError(f"--scale must be a power of two between 1 and 1024, not {scale}")
    heads, head_dim = (8, 128 // scale) if scale <= 128 else (1024 // scale, 1)
    return KVLayout(32, chunk_tokens, heads, head_dim, "bfloat16")


def add_bench_parser(sub, name: str, help: str, run):
    """A benchmark subcommand with the options every benchmark has (``--quick``, ``--json``, ``--plot``)."""
    p = sub.add_parser(name, help=help)
    p.add_argument("--quick", action="store_true", help="a tiny run (the smoke test in `make test`)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="also draw the results into this PNG")
    p.set_defaults(bench=run)
    return p


def s3_client(endpoint: str, access_key: str, secret_key: str, connections: int = 16):
    """An aiobotocore S3 client (path-style, ``connections`` pooled) for ``async with``."""
    from aiobotocore.session import get_session
    from botocore.config import Config as BotoConfig

    return get_session().create_client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=access_key, aws_secret_access_key=secret_key,
        config=BotoConfig(s3={"addressing_style": "path"}, max_pool_connections=connections))


def print_targets(met: dict[str, bool]) -> None:
    """The benchmark issue's targets this run covers, each marked met or MISSED."""
    print()
    for name, ok in met.items():
        print(f"- {name}: {'met' if ok else 'MISSED'}")


def print_table(headers: list[str], rows: list[list[object]]) -> None:
    """A Markdown table on stdout."""
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
