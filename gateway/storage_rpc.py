"""Client of the storage-server RPC (:mod:`protocol.rpc`)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from protocol.config import Config
from protocol.errors import ErrorCode, S3Error
from protocol.rpc import MAX_REQUEST_LINE, Op, RpcRequest, decode_reply, reply_bytes
from protocol.rpc_auth import HANDSHAKE_TIMEOUT_S, client_handshake, storage_rpc_key

CONNECT_TIMEOUT_S = 5.0

log = logging.getLogger("objectcache.gateway.storage_rpc")


class StorageServerClient:
    # The longest reply line read (a longer reply comes after a line announcing it: protocol.rpc.encode_reply).
    # A class attribute so a test can lower it for every client of its process, with the server's reply_line_limit.
    line_limit = MAX_REQUEST_LINE

    def __init__(self, config: Config) -> None:
        ss = config.storage_server
        self._tcp = ss.tcp
        self._socket = str(config.rpc_socket)
        self._key = storage_rpc_key(ss.rpc_key, ss.rpc_key_file) if ss.tcp else None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            if self._tcp:
                host, _, port = self._tcp.rpartition(":")
                coro = asyncio.open_connection(host.strip("[]"), int(port), limit=self.line_limit)
            else:
                coro = asyncio.open_unix_connection(self._socket, limit=self.line_limit)
            reader, writer = await asyncio.wait_for(coro, CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as e:
            raise S3Error(ErrorCode.ServiceUnavailable, f"The storage server is not reachable ({e.__class__.__name__}); plain S3 requests still work.") from None
        if self._key is not None:
            await self._authenticate(reader, writer)
        return reader, writer

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Prove this gateway holds the RPC key (and check the storage server does); a refusal is the operator's
        to fix, so the client sees 503 and the log says why."""
        try:
            await asyncio.wait_for(client_handshake(reader, writer, self._key), HANDSHAKE_TIMEOUT_S)
        except S3Error as e:
            writer.close()
            if e.code == ErrorCode.ServiceUnavailable:
                raise
            log.error("storage-server RPC at %s: %s", self._tcp, e.message)
            raise S3Error(ErrorCode.ServiceUnavailable, "The storage server refused this gateway (RPC key mismatch; see the gateway log).") from None
        except (OSError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
            writer.close()
            log.error("storage-server RPC at %s: no authentication handshake (%s); is storage_server.rpc_key_file set on both?", self._tcp, e.__class__.__name__)
            raise S3Error(ErrorCode.ServiceUnavailable, "The storage server did not complete the RPC handshake (see the gateway log).") from None

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
            if line.startswith(b'{"auth"'):  # a challenge: the listener wants a key this gateway does not have
                log.error("storage-server RPC at %s requires a shared key: set storage_server.rpc_key_file on the gateway too", self._tcp)
                raise S3Error(ErrorCode.ServiceUnavailable, "The storage server requires an RPC key this gateway does not have (see the gateway log).")
            reply = decode_reply(line)
            if (n := reply_bytes(reply)) is not None:  # a long reply follows its line
                reply = decode_reply(await reader.readexactly(n))
            return reply, reader, writer
        except (OSError, ValueError, asyncio.IncompleteReadError) as e:
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
