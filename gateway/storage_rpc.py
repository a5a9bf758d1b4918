"""Client of the storage-server RPC (:mod:`protocol.rpc`)."""

from __future__ import annotations

import asyncio
from typing import Any

from protocol.config import Config
from protocol.errors import ErrorCode, S3Error
from protocol.rpc import MAX_REQUEST_LINE, Op, RpcRequest, decode_reply

CONNECT_TIMEOUT_S = 5.0


class StorageServerClient:
    def __init__(self, config: Config) -> None:
        self._tcp = config.storage_server.tcp
        self._socket = str(config.rpc_socket)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            if self._tcp:
                host, _, port = self._tcp.rpartition(":")
                coro = asyncio.open_connection(host, int(port), limit=MAX_REQUEST_LINE)
            else:
                coro = asyncio.open_unix_connection(self._socket, limit=MAX_REQUEST_LINE)
            return await asyncio.wait_for(coro, CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as e:
            raise S3Error(ErrorCode.ServiceUnavailable, f"The storage server is not reachable ({e.__class__.__name__}); plain S3 requests still work.") from None

    async def _request(self, op: Op, body: bytes | memoryview, fields: dict[str, Any]) -> tuple[dict, asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await self._connect()
        try:
            writer.write(RpcRequest(op, fields, len(body)).encode())
            if body:
                writer.write(body)
            await writer.drain()
            line = await reader.readline()
            if not line:
                raise S3Error(ErrorCode.ServiceUnavailable, "The storage server closed the connection before answering.")
            return decode_reply(line), reader, writer
        except (OSError, ValueError) as e:
            writer.close()
            raise S3Error(ErrorCode.ServiceUnavailable, f"The storage server failed mid-request ({e.__class__.__name__}).") from None
        except BaseException:
            writer.close()
            raise

    async def call(self, op: Op, body: bytes | memoryview = b"", **fields: Any) -> dict:
        reply, _, writer = await self._request(op, body, fields)
        writer.close()
        return reply

    async def open_stream(self, op: Op, body: bytes | memoryview = b"", **fields: Any) -> tuple[dict, asyncio.StreamReader, asyncio.StreamWriter]:
        """Send a request whose reply is followed by a frame stream; the caller closes ``writer``."""
        return await self._request(op, body, fields)
