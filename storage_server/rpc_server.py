"""The storage server's RPC listener: one JSON request line (+ body) in, one reply line out.

It knows the envelope (:mod:`protocol.rpc`) and nothing of the operations:
each :class:`~protocol.rpc.Op` maps to a handler. A handler returns the reply's
fields, or ``None`` when it has streamed its own response (kv-get), after which
the connection closes. Every failure answers an error reply; a malformed line
never drops the connection with a traceback.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from protocol.errors import ErrorCode, S3Error, storage_full
from protocol.rpc import MAX_REPLY_LINE, MAX_REQUEST_LINE, Op, RpcRequest, encode_error, encode_reply
from protocol.rpc_auth import HANDSHAKE_TIMEOUT_S, SharedKey, server_handshake

log = logging.getLogger("objectcache.storage_server.rpc")

Reply = dict[str, Any] | None  # None: the handler streamed its own response


@dataclass
class RpcCall:
    """One request: its envelope, its raw body, and the connection (for streaming replies)."""

    request: RpcRequest
    body: bytes
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def field(self, name: str) -> str:
        return self.request.text(name)


RpcHandler = Callable[[RpcCall], Awaitable[Reply]]
# Connections of a keyed listener still in their handshake at once; more are refused (no key holder
# needs many: the bound is for strangers who connect and say nothing, each for up to HANDSHAKE_TIMEOUT_S).
MAX_PENDING_HANDSHAKES = 128
# Checks a request from its line alone, before its body is read (raise S3Error to refuse it unread).
HeaderCheck = Callable[[RpcRequest], None]


class _RefusedUnread(Exception):
    """A request refused from its line alone; its body was never read, so the connection cannot go on."""

    def __init__(self, error: S3Error) -> None:
        super().__init__(error.message)
        self.error = error


class RpcServer:
    """``request_timeout_s``: how long a connection may take to send a whole request (a network-facing
    listener's bound on idle or slow clients); ``None`` waits for ever (the gateway's trusted socket).
    ``single_request``: close each connection after its first reply. ``max_connections``: connections
    open at once; more are answered ``ServiceUnavailable`` and closed. ``check_header``: runs on each
    request line before its body is read, so a request refused there costs no body in memory.
    ``reply_line_limit``: a longer reply goes after a short line announcing it (:func:`~protocol.rpc.encode_reply`);
    tests lower it to exercise that framing with small replies. ``keep_after_stream``: a connection whose streamed
    reply ended (the handler returned with its peer still connected) serves the peer's next request, even with
    ``single_request`` (the session socket: an engine's kv-gets reuse one connection instead of connecting each time)."""

    def __init__(self, handlers: Mapping[Op, RpcHandler], max_body: int, request_timeout_s: float | None = None,
                 single_request: bool = False, max_connections: int | None = None,
                 check_header: HeaderCheck | None = None, line_limit: int = MAX_REQUEST_LINE, keep_after_stream: bool = False) -> None:
        self.handlers = dict(handlers)
        self.line_limit = line_limit  # the longest request line (also what a connection may buffer before it)
        self.reply_line_limit = MAX_REPLY_LINE
        self.max_body = max_body
        self.request_timeout_s = request_timeout_s
        self.single_request = single_request
        self.keep_after_stream = keep_after_stream
        self.max_connections = max_connections
        self.check_header = check_header
        self.connections = 0
        self.handshaking = 0
        self.refused = 0

    async def _read_request(self, reader: asyncio.StreamReader) -> tuple[RpcRequest, bytes] | None:
        """The next request and its body (``None`` at the end of the stream)."""
        line = await reader.readline()
        if not line:
            return None
        request = RpcRequest.decode(line, self.max_body)
        try:
            if request.op not in self.handlers:
                raise S3Error(ErrorCode.InvalidRequest, f"bad RPC request: op {request.op.value!r} is not served on this listener")
            if self.check_header is not None:
                self.check_header(request)
        except S3Error as e:
            raise _RefusedUnread(e) from None
        body = await reader.readexactly(request.body_bytes) if request.body_bytes else b""
        return request, body

    async def _answer(self, read: tuple[RpcRequest, bytes], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes | None:
        """The reply line for one request (``None``: the handler streamed its own response)."""
        request, body = read
        try:
            handler = self.handlers.get(request.op)
            if handler is None:
                raise S3Error(ErrorCode.InvalidRequest, f"bad RPC request: op {request.op.value!r} is not served on this listener")
            reply = await handler(RpcCall(request, body, reader, writer))
            return None if reply is None else encode_reply(reply, self.reply_line_limit)
        except S3Error as e:
            return encode_error(e)
        except Exception as e:  # a bug, not bad input: answer, log, keep serving
            full = storage_full(e)  # unless it is a full disk: that is 507, whichever layer met it
            if full is not None:
                log.warning("RPC request met a full disk: %s", e)
                return encode_error(full)
            log.exception("RPC request failed")
            return encode_error(S3Error(ErrorCode.InternalError, f"storage server error: {e.__class__.__name__}"))

    async def serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: SharedKey | None = None) -> None:
        """Serve one connection; with ``key``, only after its peer proved it holds the key (:mod:`protocol.rpc_auth`)."""
        if self.max_connections is not None and self.connections >= self.max_connections:
            self.refused += 1
            writer.write(encode_error(S3Error(ErrorCode.ServiceUnavailable, "Too many connections; retry shortly.")))
            writer.close()
            return
        self.connections += 1
        try:
            if key is not None and not await self._admitted(reader, writer, key):
                return
            await self._serve(reader, writer)
        finally:
            self.connections -= 1
            writer.close()

    async def _admitted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: SharedKey) -> bool:
        if self.handshaking >= MAX_PENDING_HANDSHAKES:
            self.refused += 1
            writer.write(encode_error(S3Error(ErrorCode.ServiceUnavailable, "Too many unauthenticated connections; retry shortly.")))
            return False
        self.handshaking += 1
        try:
            await asyncio.wait_for(server_handshake(reader, writer, key), HANDSHAKE_TIMEOUT_S)
            return True
        except S3Error as e:
            log.warning("RPC connection from %s refused: %s", writer.get_extra_info("peername"), e.message)
            writer.write(encode_error(e))
        except asyncio.TimeoutError:
            writer.write(encode_error(S3Error(ErrorCode.RequestTimeout, f"no authentication within {HANDSHAKE_TIMEOUT_S:g} s")))
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass  # gone, or a line longer than the stream's limit
        finally:
            self.handshaking -= 1
        return False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    async with asyncio.timeout(self.request_timeout_s):  # a deadline, not a task per request (wait_for makes one)
                        read = await self._read_request(reader)
                except _RefusedUnread as refused:  # its body is still in the stream: answer and close
                    writer.write(encode_error(refused.error))
                    await writer.drain()
                    break
                except S3Error as e:  # a malformed request line: answer, keep serving
                    writer.write(encode_error(e))
                    await writer.drain()
                    if self.single_request:
                        break
                    continue
                except asyncio.TimeoutError:  # the stream may be mid-request: answer and close
                    writer.write(encode_error(S3Error(ErrorCode.RequestTimeout, f"no complete request within {self.request_timeout_s:g} s")))
                    break
                if read is None:
                    break
                out = await self._answer(read, reader, writer)
                if out is None:
                    if self.keep_after_stream and not writer.is_closing() and not reader.at_eof():
                        continue
                    break  # streamed; one streaming request per connection
                writer.write(out)
                await writer.drain()
                if self.single_request:
                    break
        except (ConnectionResetError, BrokenPipeError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # shutdown stopped this connection's transfer: closing the stream below is the whole answer
        except ValueError:  # a request line longer than line_limit
            writer.write(encode_error(S3Error(ErrorCode.InvalidRequest, f"bad RPC request: line longer than {self.line_limit} bytes")))

    async def listen(self, socket_path: str, tcp: str = "", key: SharedKey | None = None) -> asyncio.AbstractServer:
        """Listen on ``tcp`` ("host:port") if given, admitting only holders of ``key`` when set; else on a
        0600 Unix socket (its permissions are its authentication)."""
        if tcp:
            host, _, port = tcp.rpartition(":")
            if key is None:
                log.warning("the storage-server RPC listens on %s without a shared key: anyone who can connect "
                            "can act as any tenant (set storage_server.rpc_key_file)", tcp)
            serve = functools.partial(self.serve_connection, key=key)
            return await asyncio.start_server(serve, host.strip("[]"), int(port), limit=self.line_limit)
        if os.path.exists(socket_path):
            os.unlink(socket_path)
        os.makedirs(os.path.dirname(socket_path) or ".", exist_ok=True)
        server = await asyncio.start_unix_server(self.serve_connection, socket_path, limit=self.line_limit)
        os.chmod(socket_path, 0o600)
        return server
