"""The SDK's end of the local fast path (:mod:`protocol.session`): one signed registration, then kv-gets on a Unix socket.

The session is registered lazily, on the first shm fetch, and again when the
storage server no longer knows it (restarted, expired, dropped at the tenant's
cap). It is bound to this process: a forked child registers its own.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable

from protocol.errors import ErrorCode, S3Error
from protocol.rpc import KVGetAccepted, Op, RpcRequest, decode_reply
from protocol.session import SessionGrant, SessionTicket

from .direct import CONNECT_TIMEOUT_S, DirectFrameStream

# A session this close to its expiry is registered afresh before a fetch rather than risk it lapsing mid-request.
RENEW_MARGIN_S = 30.0


class NoResponse:
    """What ``fetch_layers`` holds where an HTTP response would be: no headers, nothing to release."""

    headers: dict[str, str] = {}

    def close(self) -> None:
        pass

    def release(self) -> None:
        pass


class LocalSession:
    """``register`` sends the signed ``kv-session`` request (through the gateway) and returns its ticket."""

    def __init__(self, register: Callable[[], Awaitable[SessionTicket]], read_timeout: float) -> None:
        self._register = register
        self._timeout = read_timeout
        self._socket = ""
        self._grant: SessionGrant | None = None
        self._expires = 0.0
        self._pid = 0
        self._lock = asyncio.Lock()

    def forget(self) -> None:
        self._grant = None

    async def _current(self) -> SessionGrant:
        async with self._lock:
            if self._grant is None or self._pid != os.getpid() or time.monotonic() > self._expires - RENEW_MARGIN_S:
                ticket = await self._register()
                reply = await self._request(ticket.socket, RpcRequest(Op.KV_SESSION_BIND, {"ticket": ticket.ticket}), b"")
                grant = SessionGrant.from_json(decode_reply(await reply._read_line()))
                reply.close()
                self._socket, self._grant, self._pid = ticket.socket, grant, os.getpid()
                self._expires = time.monotonic() + grant.expires_in_s
            return self._grant

    async def open(self, descriptor: bytes) -> DirectFrameStream:
        """A kv-get of ``descriptor`` on the session socket, its reply line read (an error raises its S3Error);
        a session the server no longer knows is registered again once."""
        for attempt in (1, 2):
            grant = await self._current()
            stream = await self._request(self._socket, RpcRequest(Op.KV_GET, {"session": grant.session, "secret": grant.secret},
                                                                  len(descriptor)), descriptor)
            try:
                stream.accepted = KVGetAccepted.from_json(decode_reply(await stream._read_line()))
                return stream
            except S3Error as e:
                stream.close()
                if attempt == 2 or e.code != ErrorCode.AccessDenied or "session" not in e.message:
                    raise
                self.forget()
            except BaseException:
                stream.close()
                raise
        raise AssertionError("unreachable")

    async def _request(self, path: str, request: RpcRequest, body: bytes) -> DirectFrameStream:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await asyncio.wait_for(loop.sock_connect(sock, path), CONNECT_TIMEOUT_S)
            await loop.sock_sendall(sock, request.encode() + body)
        except (OSError, asyncio.TimeoutError) as e:
            sock.close()
            raise S3Error(ErrorCode.ServiceUnavailable, f"the storage server's session socket {path} is not reachable "
                          f"({type(e).__name__}: {e})") from None
        return DirectFrameStream(sock, self._timeout)
