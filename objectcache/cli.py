"""The ``objectcache`` command: ``serve`` (gateway + storage server), or each part alone."""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from objectcache.data_lock import DataDirInUse, adopt_lock, lock_data_dir
from objectcache.dev_tenant import DEV_CREDENTIALS_FILE, endpoint_url, recorded_dev_tenant, with_dev_tenant, write_dev_credentials
from protocol.config import Config, ConfigError, load_config

from . import logging_setup
from .lifeline import spawn
from .sdnotify import notify
from .supervise import Supervised

READY = "READY"
# A process that could not start and has said why in one line on stderr exits with this;
# `serve` then exits with it too, adding nothing.
EXIT_CANNOT_START = 3


class CannotStart(Exception):
    """Start-up failed for a reason one line explains (no traceback)."""


def _say(line: str) -> None:
    """A line for whoever watches the process (the terminal under ``serve``, the journal under systemd)."""
    print(f"objectcache: {line}", file=sys.stderr, flush=True)


def _listen_error(host: str, port: int, e: OSError) -> CannotStart:
    if e.errno == errno.EADDRINUSE:
        return CannotStart(f"port {port} is already in use ({host}:{port}: another process listens there; "
                           "stop it or choose another port with --port or OBJECTCACHE_GATEWAY_PORT)")
    return CannotStart(f"cannot listen on {host}:{port} ({e.strerror or e})")


def _load(args: argparse.Namespace, env: dict[str, str] | None = None) -> Config:
    return load_config(
        getattr(args, "config", None),
        env,
        gateway__host=getattr(args, "host", None),
        gateway__port=getattr(args, "port", None),
        store__data_dir=getattr(args, "data_dir", None),
    )


def _common(p: argparse.ArgumentParser, with_listen: bool) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML configuration file")
    p.add_argument("--data-dir", metavar="DIR", help="local-disk store directory (default ./data)")
    if with_listen:
        p.add_argument("--host", help="gateway listen address (default 127.0.0.1)")
        p.add_argument("--port", type=int, help="gateway port (default 9000; 0 picks a free one)")


def _install_loop() -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        pass


async def _run_until_signal(start) -> None:
    """Serve until SIGINT/SIGTERM, telling systemd (``Type=notify``) when ready and when stopping; ``cleanup`` drains."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    cleanup = await start()
    notify("READY=1")
    try:
        await stop.wait()
    finally:
        notify("STOPPING=1")
        await cleanup()


def cmd_gateway(args: argparse.Namespace, cfg: Config) -> int:
    from gateway.server import start_gateway
    from storage_server.store import open_object_store

    cfg, dev = with_dev_tenant(cfg)

    async def start():
        try:
            port, stop = await start_gateway(cfg, open_object_store(cfg), say=_say)
        except OSError as e:
            raise _listen_error(cfg.gateway.host, cfg.gateway.port, e) from None
        if dev is not None:
            # Only this process knows the port (--port 0 picks one): record it before READY.
            write_dev_credentials(cfg, dev, port)
        # The URL a client on this host can use (a wildcard listen address is no address to connect to).
        print(f"{READY} gateway {endpoint_url(cfg.gateway.host, port)}", flush=True)
        return stop

    asyncio.run(_run_until_signal(start))
    return 0


def cmd_storage_server(args: argparse.Namespace, cfg: Config) -> int:
    from storage_server.daemon import StorageServer
    from storage_server.fd_budget import raise_fd_limit
    from storage_server.store import open_chunk_source, open_object_store

    # Before anything opens the store or its socket: one storage server per data directory.
    lock_fd = adopt_lock(args.lock_fd, cfg.data_dir) if args.lock_fd is not None else lock_data_dir(cfg.data_dir)
    raise_fd_limit()  # before the open-file cache sizes itself from it

    async def start():
        store = open_object_store(cfg)
        daemon = StorageServer(cfg, store, open_chunk_source(cfg, store))
        server = await daemon.start()
        where = cfg.storage_server.tcp or str(cfg.rpc_socket)
        print(f"{READY} storage-server {where}", flush=True)

        async def cleanup() -> None:
            server.close()  # no new RPC connections; transfers in flight go on
            if daemon.kv.active:
                _say(f"storage server draining: waiting up to {cfg.storage_server.drain_timeout_s:g} s for "
                     f"{len(daemon.kv.active)} kv-get(s) in flight")
            await daemon.drain(cfg.storage_server.drain_timeout_s)
            await server.wait_closed()
            await daemon.close()

        return cleanup

    try:
        asyncio.run(_run_until_signal(start))
    finally:
        os.close(lock_fd)
    return 0


def _spawn(role: str, args: argparse.Namespace, port: int | None, lock_fd: int | None = None) -> subprocess.Popen:
    argv = [sys.executable, "-m", "objectcache", role]
    if args.config:
        argv += ["--config", args.config]
    if args.data_dir:
        argv += ["--data-dir", args.data_dir]
    if role == "gateway":
        if args.host:
            argv += ["--host", args.host]
        if port is not None:
            argv += ["--port", str(port)]
    if lock_fd is not None:
        argv += ["--lock-fd", str(lock_fd)]
    # The children must not talk to systemd themselves: ``serve`` is the unit's main process and says READY once both are.
    env = dict({k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")])))
    # Tied to serve's life: a serve killed outright (SIGKILL, OOM) takes both with it instead of leaving them on the port and data directory.
    return spawn(argv, stdout=subprocess.PIPE, text=True, env=env, pass_fds=() if lock_fd is None else (lock_fd,))


def _echo(stream) -> None:
    for line in stream:
        print(line, end="", flush=True)


def _await_ready(proc: subprocess.Popen, role: str) -> str:
    """Wait for the child's READY line; from then on a thread echoes its stdout, so a full pipe never blocks it."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(READY):
            threading.Thread(target=_echo, args=(proc.stdout,), daemon=True, name=f"{role}-stdout").start()
            return line.split(maxsplit=2)[2].strip()
        print(line, end="")
    code = proc.wait()
    if code == EXIT_CANNOT_START:
        raise SystemExit(code)  # the child has said why on stderr
    raise SystemExit(f"objectcache: the {role} exited before it was ready (exit code {code})")


def cmd_serve(args: argparse.Namespace, cfg: Config) -> int:
    """Run both processes and keep both up: either one that exits is restarted (:mod:`.supervise`)."""
    # The data directory's lock comes first: a second server refused here has written nothing.
    lock_fd = lock_data_dir(cfg.data_dir)
    port: int | None = args.port  # the gateway's, fixed after its first start (--port 0 picks one)

    storage = Supervised("storage server", "plain S3 keeps working meanwhile", lambda: _spawn("storage-server", args, None, lock_fd),
                         lambda p: _await_ready(p, "storage server"))
    gateway = Supervised("gateway", "the storage server and its regions stay up meanwhile", lambda: _spawn("gateway", args, port),
                         lambda p: _await_ready(p, "gateway"))
    children = (gateway, storage)  # stopped in this order: the gateway drains first (its requests may need the storage server)
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        if not stopping:
            _say(f"stopping: the gateway finishes requests in flight (up to {cfg.gateway.drain_timeout_s:g} s), "
                 "then the storage server its kv-gets")
        stopping = True
        for child in children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.terminate()
                return  # the gateway drains first; the storage server is stopped below once it has

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        rpc = storage.launch()
        endpoint = gateway.launch()
        port = int(endpoint.rsplit(":", 1)[1])
        # The gateway wrote the dev tenant's keys once it had bound its port (it generated them on a first start).
        dev = None if cfg.tenants else recorded_dev_tenant(cfg)
        print(f"ObjectCache is running.\n  endpoint:       {endpoint}\n  storage server: {rpc}\n  data directory: {cfg.data_dir}")
        if dev is not None:
            print(f"  access key:     {dev.access_key}\n  secret key:     {dev.secret_key}\n  region:         {cfg.gateway.region}")
            print(f"  (shell: source {cfg.data_dir / DEV_CREDENTIALS_FILE})")
            if cfg.store.backend != "local":
                print(f"  tenant:         {dev.name} (this node's own; nodes of a cluster share tenants_file: README 'Scaling out')")
        else:
            print(f"  tenants:        {', '.join(t.name for t in cfg.tenants)} (keys in your config)")
        print("Press Ctrl-C to stop.", flush=True)
        notify("READY=1")
        while not stopping:
            time.sleep(0.2)
            for child in children:
                if not stopping:
                    child.tend(time.monotonic(), lambda line: print(line, flush=True))
    finally:
        notify("STOPPING=1")
        for child in children:
            p = child.proc
            if p is None:
                continue
            if p.poll() is None:
                p.terminate()
            try:
                p.wait(timeout=cfg.gateway.drain_timeout_s + 10)
            except subprocess.TimeoutExpired:
                p.kill()
    codes = [c.proc.returncode for c in children if c.proc is not None]
    return 0 if all(c in (0, -signal.SIGTERM) for c in codes) else 1


def cmd_bench(args: argparse.Namespace, cfg: Config) -> int:
    from bench.cli import main as bench_main

    return bench_main(args.bench_args)


def build_parser() -> argparse.ArgumentParser:
    """The command line (deployment files' commands are checked against it)."""
    parser = argparse.ArgumentParser(prog="objectcache", description="S3-compatible object storage for LLM prefix KV cache")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="run the gateway and the storage server on the local-disk store")
    _common(p, True)
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("gateway", help="run the S3 gateway alone")
    _common(p, True)
    p.set_defaults(func=cmd_gateway)
    p = sub.add_parser("storage-server", help="run the storage-server daemon alone")
    _common(p, False)
    p.add_argument("--lock-fd", type=int, help=argparse.SUPPRESS)  # the data directory's lock, held by `serve`
    p.set_defaults(func=cmd_storage_server)
    # The benchmark harness parses its own arguments: it is imported only when asked for.
    p = sub.add_parser("bench", help="run a benchmark (see README: Benchmarks)", add_help=False)
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # bench's arguments are its own, --help included (REMAINDER does not take an option in first place).
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        args.bench_args = rest + args.bench_args
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        # Every command reads the configuration first (bench only its environment part), so a
        # bad key or an unknown OBJECTCACHE_* variable stops it before anything starts.
        cfg = _load(args)
        logging_setup.configure(cfg.log)
        if args.command != "serve":
            _install_loop()
        return args.func(args, cfg)
    except ConfigError as e:
        print(f"objectcache: configuration error: {e}", file=sys.stderr)
        return 2
    except (CannotStart, DataDirInUse) as e:
        print(f"objectcache: {e}", file=sys.stderr)
        return EXIT_CANNOT_START


if __name__ == "__main__":
    sys.exit(main())
