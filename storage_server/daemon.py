"""The storage-server daemon: owns the store and answers the gateway's RPC.

It listens on a Unix socket (or TCP) and speaks newline-delimited JSON
requests. The KV descriptor executor plugs into the same dispatch table.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .backend import Backend, LocalDiskBackend
from .config import Config
from .errors import ErrorCode, S3Error

log = logging.getLogger("objectcache.storage_server")

MAX_REQUEST_LINE = 16 * 1024 * 1024

RpcHandler = Callable[["StorageServer", dict[str, Any]], Awaitable[dict[str, Any]]]


def open_backend(config: Config) -> Backend:
    """The store both processes open (the daemon owns it; the gateway serves plain S3 through it)."""
    return LocalDiskBackend(config.data_dir, io_threads=config.store.io_threads)


class StorageServer:
    def __init__(self, config: Config, backend: Backend) -> None:
        self.config = config
        self.backend = backend
        self.started = time.time()
        self.handlers: dict[str, RpcHandler] = {"ping": _ping, "status": _status}

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    request = json.loads(line)
                    handler = self.handlers.get(request.get("op"))
                    if handler is None:
                        raise S3Error(ErrorCode.InvalidRequest, f"unknown storage-server op {request.get('op')!r}")
                    reply = {"ok": True, **await handler(self, request)}
                except S3Error as e:
                    reply = {"ok": False, "error": e.to_dict()}
                except (ValueError, AttributeError) as e:
                    reply = {"ok": False, "error": S3Error(ErrorCode.InvalidRequest, f"bad RPC request: {e}").to_dict()}
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (ConnectionResetError, BrokenPipeError):
            pass
        finally:
            writer.close()

    async def start(self) -> asyncio.AbstractServer:
        if self.config.storage_server.tcp:
            host, _, port = self.config.storage_server.tcp.rpartition(":")
            return await asyncio.start_server(self._serve_connection, host, int(port), limit=MAX_REQUEST_LINE)
        path = self.config.rpc_socket
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            path.unlink()
        server = await asyncio.start_unix_server(self._serve_connection, str(path), limit=MAX_REQUEST_LINE)
        os.chmod(path, 0o600)
        return server


async def _ping(server: StorageServer, request: dict[str, Any]) -> dict[str, Any]:
    return {"pong": True}


async def _status(server: StorageServer, request: dict[str, Any]) -> dict[str, Any]:
    return {"uptime_s": time.time() - server.started, "data_dir": str(server.config.data_dir), "pid": os.getpid()}
