"""The SDK's end of the local fast path (:mod:`protocol.session`): one signed registration, then kv-gets on a Unix socket.

The session is registered lazily, on the first shm fetch, and again when the
storage server no longer knows it (restarted, expired, dropped at the tenant's
cap). It is bound to this process: a forked child registers its own.

An *optional* session (the SDK's default, ``local_session=None``) steps aside where the
node does not offer the fast path: :class:`FastPathUnavailable` tells the client to send
that kv-get through the gateway instead, which gives the same guarantees.
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
from protocol.wire import Descriptor

from .direct import CONNECT_TIMEOUT_S, DirectFrameStream
from .key_list_names import KeyListNames

# A session this close to its expiry is registered afresh before a fetch rather than risk it lapsing mid-request.
RENEW_MARGIN_S = 30.0
# An optional session whose socket could not be reached is tried again after this long (the gateway path meanwhile).
RETRY_UNREACHABLE_S = 30.0
# Connections of finished kv-gets kept for the next ones (a connect and the server's accept cost ~0.25 ms a kv-get).
MAX_IDLE_CONNECTIONS = 2


class FastPathUnavailable(Exception):
    """An optional session cannot serve this kv-get (the node has no fast path, or its socket is out of reach): use the gateway."""


class NoResponse:
    """What ``fetch_layers`` holds where an HTTP response would be: no headers, nothing to release."""

    headers: dict[str, str] = {}

    def close(self) -> None:
        pass

    def release(self) -> None:
        pass


class LocalSession:
    """``register`` sends the signed ``kv-session`` request (through the gateway) and returns its ticket."""

    def __init__(self, register: Callable[[], Awaitable[SessionTicket]], read_timeout: float, optional: bool = False) -> None:
        self._register = register
        self.optional = optional
        self._off_until = 0.0  # optional and unavailable: the gateway path until then (inf: the node has none)
        self.unavailable = ""  # why, for logs and tests
        self._timeout = read_timeout
        self._socket = ""
        self._grant: SessionGrant | None = None
        self._expires = 0.0
        self._pid = 0
        self._lock = asyncio.Lock()
        self._idle: list[socket.socket] = []  # session-socket connections whose kv-get ended cleanly
        self._names = KeyListNames()

    def forget(self) -> None:
        self._grant = None

    def available(self) -> bool:
        """False while an optional session stepped aside (see :class:`FastPathUnavailable`)."""
        return time.monotonic() >= self._off_until

    def _step_aside(self, why: str, for_s: float) -> FastPathUnavailable:
        self.forget()
        self._off_until, self.unavailable = time.monotonic() + for_s, why
        return FastPathUnavailable(why)

    async def prepare(self) -> None:
        """Register the session now (``warm_up``), not on the first fetch."""
        if self.available():
            await self._current()

    async def _current(self) -> SessionGrant:
        async with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's connections are the parent's
                self.close_idle()
            if self._grant is None or self._pid != os.getpid() or time.monotonic() > self._expires - RENEW_MARGIN_S:
                try:
                    ticket = await self._register()
                except S3Error as e:
                    # NotImplemented: the node's fast path is off (max_sessions_per_tenant = 0), or the gateway predates it.
                    if not self.optional or e.code is not ErrorCode.NotImplemented:
                        raise
                    raise self._step_aside(f"the node offers no local fast path ({e.code.name}: {e.message})", float("inf")) from None
                reply = await self._request(ticket.socket, RpcRequest(Op.KV_SESSION_BIND, {"ticket": ticket.ticket}), b"")
                grant = SessionGrant.from_json(decode_reply(await reply._read_line()))
                reply.close()
                self._socket, self._grant, self._pid = ticket.socket, grant, os.getpid()
                self._names.clear()  # a new session knows none of the old one's names
                self._expires = time.monotonic() + grant.expires_in_s
            return self._grant

    async def open(self, descriptor: Descriptor) -> DirectFrameStream:
        """A kv-get of ``descriptor`` on the session socket, its reply line read (an error raises its S3Error);
        a session the server no longer knows is registered again once. Keys this session sent before go as the
        16-byte reference they were named by; a reference the node no longer holds is answered by sending the keys."""
        by_ref, retried = True, False
        while True:
            grant = await self._current()
            body = self._names.encode(descriptor, by_ref)
            stream = await self._request(self._socket, RpcRequest(Op.KV_GET, {"session": grant.session, "secret": grant.secret},
                                                                  len(body)), body, reuse=True)
            try:
                stream.accepted = KVGetAccepted.from_json(decode_reply(await stream._read_line()))
                return stream
            except S3Error as e:
                stream.close()
                if e.code is ErrorCode.KVUnknownKeyList and by_ref:  # the node let go of the name: the keys themselves
                    by_ref = False
                    continue
                if e.code is ErrorCode.KVInvalidDescriptor and "unknown flag bits" in e.message and self._names.enabled:
                    self._names.enabled = False  # a node that predates key list names: plain descriptors from now on
                    continue
                if retried:
                    raise
                retried = True
                # A kept connection the server let go of as we sent (idle past its request timeout: its RequestTimeout
                # line, or closed unread): this kv-get never ran, so it is sent once more on a new connection. Not
                # after this process's own read timeout (the server may still be running it).
                if stream.reused and not stream.broken and (e.code is ErrorCode.RequestTimeout or stream.closed_unanswered):
                    by_ref = False  # the node never read that body: a name it carried is unknown there
                    continue
                if e.code != ErrorCode.AccessDenied or "session" not in e.message:
                    raise
                self.forget()
            except BaseException:
                stream.close()
                raise

    def keep(self, stream: DirectFrameStream) -> None:
        """A kv-get's stream that ended at its END or ERROR frame: its connection serves a later kv-get."""
        sock = stream.detach()
        if sock is None:
            return
        if self._pid == os.getpid() and len(self._idle) < MAX_IDLE_CONNECTIONS:
            self._idle.append(sock)
        else:
            sock.close()

    def close_idle(self) -> None:
        while self._idle:
            self._idle.pop().close()

    def _idle_connection(self) -> socket.socket | None:
        """A kept connection still open with nothing unread (one the server closed, e.g. idle past its request
        timeout, is dropped)."""
        while self._idle:
            sock = self._idle.pop()
            try:
                sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                return sock
            except OSError:
                pass
            sock.close()
        return None

    async def _request(self, path: str, request: RpcRequest, body: bytes, reuse: bool = False) -> DirectFrameStream:
        loop = asyncio.get_running_loop()
        kept = self._idle_connection() if reuse else None
        if kept is not None:
            try:
                await loop.sock_sendall(kept, request.encode() + body)
                stream = DirectFrameStream(kept, self._timeout, keep=self.keep)
                stream.reused = True
                return stream
            except OSError:
                kept.close()  # gone meanwhile: a new connection below
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            async with asyncio.timeout(CONNECT_TIMEOUT_S):  # a deadline, not a task per kv-get (wait_for makes one)
                await loop.sock_connect(sock, path)
            await loop.sock_sendall(sock, request.encode() + body)
        except (OSError, asyncio.TimeoutError) as e:
            sock.close()
            if self.optional:  # another mount namespace, or the storage server restarting: the gateway path for now
                raise self._step_aside(f"the session socket {path} is not reachable ({type(e).__name__}: {e})", RETRY_UNREACHABLE_S) from None
            raise S3Error(ErrorCode.ServiceUnavailable, f"the storage server's session socket {path} is not reachable "
                          f"({type(e).__name__}: {e})") from None
        return DirectFrameStream(sock, self._timeout, keep=self.keep if reuse else None)
