"""The local fast path's sessions (:mod:`protocol.session`): capabilities bound to one process, and their socket.

The gateway authenticates the registration and vouches for the tenant and the bucket
(``Op.KV_SESSION``, with the incarnation it checked); the registry hands out a one-time
ticket for it. The engine redeems the ticket on the session socket, whose peer
credentials (``SO_PEERCRED``, set by the kernel at connect) name the process the
session is bound to. A kv-get on the socket is refused before its body is read unless
the session exists, has not expired, its secret matches and the connection's peer is
that process (pid, uid and gid); the bucket must still be the incarnation registered
(deleted and recreated, by anyone, is another bucket). Then it runs through
:meth:`KVService.get` as the session's tenant and bucket, like a gateway's kv-get.
A connection whose kv-get ended (END or ERROR frame sent, the peer still there) waits for that
peer's next kv-get, checked the same way: connecting and accepting cost ~0.25 ms a kv-get.

The socket is world-connectable on purpose (an engine may run as another user, as for
the shm hand-over): the capability, handed out only over the signed HTTP API, and the
peer check are what admit a request.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hmac
import logging
import os
import secrets
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from protocol.config import StorageServerConfig
from protocol.errors import ErrorCode, S3Error
from protocol.rpc import Op, RpcRequest
from protocol.session import (
    MAX_PENDING_SESSIONS_PER_TENANT,
    MAX_SESSION_LINE,
    SESSION_ID_BYTES,
    SESSION_SECRET_BYTES,
    SESSION_TICKET_BYTES,
    SESSION_TICKET_TTL_S,
    SessionGrant,
    SessionTicket,
)
from protocol.wire import Descriptor, decode_descriptor

from .data_endpoint import connection_cap
from .rpc_server import Reply, RpcCall, RpcServer
from .session_key_lists import SessionKeyLists

log = logging.getLogger("objectcache.storage_server.sessions")

_UCRED = struct.Struct("3i")


@dataclass(frozen=True)
class Peer:
    """The process at the other end of a Unix socket, as the kernel recorded it at connect."""

    pid: int
    uid: int
    gid: int

    @classmethod
    def of(cls, sock: socket.socket) -> "Peer":
        return cls(*_UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)))


@dataclass(frozen=True)
class Pending:
    tenant: str
    bucket: str
    incarnation: str
    expires: float


@dataclass(frozen=True)
class Session:
    session_id: bytes
    secret: bytes
    tenant: str
    bucket: str
    incarnation: str
    peer: Peer
    expires: float


class SessionRegistry:
    """Tickets and sessions; pure bookkeeping (``clock`` injected), no I/O."""

    def __init__(self, ttl_s: float, max_per_tenant: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_per_tenant = max_per_tenant
        self.clock = clock
        self._pending: dict[bytes, Pending] = {}
        self._sessions: dict[bytes, Session] = {}

    def offer(self, tenant: str, bucket: str, incarnation: str) -> bytes:
        """A one-time ticket for ``tenant``'s session on ``bucket`` (the gateway checked both)."""
        if self.max_per_tenant < 1:
            raise S3Error(ErrorCode.NotImplemented, "this storage server has no local fast path (storage_server.max_sessions_per_tenant = 0)")
        now = self.clock()
        self._pending = {k: p for k, p in self._pending.items() if p.expires > now}
        if sum(p.tenant == tenant for p in self._pending.values()) >= MAX_PENDING_SESSIONS_PER_TENANT:
            raise S3Error(ErrorCode.ServiceUnavailable, f"tenant {tenant!r} has {MAX_PENDING_SESSIONS_PER_TENANT} session registrations "
                          "pending; bind them first")
        ticket = secrets.token_bytes(SESSION_TICKET_BYTES)
        self._pending[ticket] = Pending(tenant, bucket, incarnation, now + SESSION_TICKET_TTL_S)
        return ticket

    def bind(self, ticket: bytes, peer: Peer) -> Session:
        """Redeem ``ticket`` for a session bound to ``peer``; the tenant's oldest session goes at its cap."""
        now = self.clock()
        pending = self._pending.pop(ticket, None)
        if pending is None or pending.expires <= now:
            raise S3Error(ErrorCode.AccessDenied, "the session ticket is unknown, used or expired; register again")
        self.expire()
        mine = sorted((s for s in self._sessions.values() if s.tenant == pending.tenant), key=lambda s: s.expires)
        for old in mine[: max(0, len(mine) - self.max_per_tenant + 1)]:
            del self._sessions[old.session_id]
        session = Session(secrets.token_bytes(SESSION_ID_BYTES), secrets.token_bytes(SESSION_SECRET_BYTES), pending.tenant,
                          pending.bucket, pending.incarnation, peer, now + self.ttl_s)
        self._sessions[session.session_id] = session
        return session

    def check(self, session_id: bytes, secret: bytes, peer: Peer) -> Session:
        """The session these credentials name, if ``peer`` is the process it is bound to and it has not expired."""
        session = self._sessions.get(session_id)
        if session is None or not hmac.compare_digest(session.secret, secret):
            raise S3Error(ErrorCode.AccessDenied, "the session is unknown or its secret does not match; register again")
        if session.expires <= self.clock():
            del self._sessions[session_id]
            raise S3Error(ErrorCode.AccessDenied, "the session expired (storage_server.session_ttl_s); register again")
        if peer != session.peer:
            raise S3Error(ErrorCode.AccessDenied, "the session is bound to another process (the registering one, by its socket "
                          "credentials); register a session of your own")
        return session

    def expire(self) -> int:
        now = self.clock()
        gone = [k for k, s in self._sessions.items() if s.expires <= now]
        for k in gone:
            del self._sessions[k]
        return len(gone)

    def status(self) -> dict[str, int]:
        return {"sessions": len(self._sessions), "pending": len(self._pending)}


_peer: contextvars.ContextVar[Peer | None] = contextvars.ContextVar("session_peer", default=None)


class SessionEndpoint:
    """The session socket: binds tickets to their process, serves the sessions' kv-gets."""

    def __init__(self, config: StorageServerConfig, path: str, kv_get: Callable[[RpcCall, Descriptor], Awaitable[Reply]], max_body: int,
                 incarnation: Callable[[str], Awaitable[str]], registry: SessionRegistry | None = None) -> None:
        self.path = path
        self.registry = registry or SessionRegistry(config.session_ttl_s, config.max_sessions_per_tenant)
        self.max_keys = config.max_descriptor_keys
        self.key_lists = SessionKeyLists()  # what each session's KEY_LIST_REF descriptors name
        self._kv_get = kv_get
        self._incarnation = incarnation
        self.kv_gets = 0
        self.connections = 0  # accepted on the session socket (a kept connection serves many kv-gets)
        self.rpc = RpcServer({Op.KV_SESSION_BIND: self.bind, Op.KV_GET: self.get}, max_body=max_body,
                             request_timeout_s=config.data_request_timeout_s, single_request=True,
                             max_connections=connection_cap(config.data_max_connections), check_header=self.check_header,
                             line_limit=MAX_SESSION_LINE, keep_after_stream=True)
        self._server: asyncio.AbstractServer | None = None

    async def offer(self, call: RpcCall) -> Reply:
        """``Op.KV_SESSION`` from the gateway, which authenticated the caller and checked the bucket is theirs."""
        bucket = call.field("bucket")
        incarnation = str(call.request.fields.get("bucket_incarnation") or "") or await self._incarnation(bucket)
        ticket = self.registry.offer(call.field("tenant"), bucket, incarnation)
        return SessionTicket(self.path, ticket.hex()).to_json()

    async def listen(self) -> None:
        if os.path.exists(self.path):
            os.unlink(self.path)
        self._server = await asyncio.start_unix_server(self._connection, self.path, limit=MAX_SESSION_LINE)
        os.chmod(self.path, 0o666)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            _peer.set(Peer.of(writer.get_extra_info("socket")))
        except (OSError, struct.error):
            writer.close()
            return
        await self.rpc.serve_connection(reader, writer)

    def check_header(self, request: RpcRequest) -> None:
        """A kv-get's session, checked from its line before its body is read."""
        if request.op == Op.KV_GET:
            self._session(request)

    def _session(self, request: RpcRequest) -> Session:
        peer = _peer.get()
        if peer is None:
            raise S3Error(ErrorCode.AccessDenied, "the session socket could not read its peer's credentials")
        return self.registry.check(_hex(request, "session", SESSION_ID_BYTES), _hex(request, "secret", SESSION_SECRET_BYTES), peer)

    async def bind(self, call: RpcCall) -> Reply:
        peer = _peer.get()
        if peer is None:
            raise S3Error(ErrorCode.AccessDenied, "the session socket could not read its peer's credentials")
        session = self.registry.bind(_hex(call.request, "ticket", SESSION_TICKET_BYTES), peer)
        return SessionGrant(session.session_id.hex(), session.secret.hex(), session.expires - self.registry.clock()).to_json()

    async def get(self, call: RpcCall) -> Reply:
        session = self._session(call.request)  # again: it may have expired while the body arrived
        try:
            current = await self._incarnation(session.bucket)
        except S3Error as e:
            if e.code != ErrorCode.NoSuchBucket:
                raise
            current = ""
        if current != session.incarnation:
            raise S3Error(ErrorCode.AccessDenied, f"the session's bucket {session.bucket!r} was deleted since the session was registered")
        d = decode_descriptor(call.body, self.max_keys, functools.partial(self.key_lists.named, session.session_id))
        if d.key_ref:
            if not d.keys_by_ref:
                self.key_lists.name(session.session_id, d.key_ref, d.chunk_keys)
            d = replace(d, key_ref=b"", keys_by_ref=False)  # resolved: a descriptor re-encoded for a peer carries the keys
        self.kv_gets += 1
        fields = {"tenant": session.tenant, "bucket": session.bucket, "request_id": f"L{os.getpid():x}-{self.kv_gets:x}"}
        return await self._kv_get(replace(call, request=replace(call.request, fields=fields)), d)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if os.path.exists(self.path):
            os.unlink(self.path)


def _hex(request: RpcRequest, name: str, size: int) -> bytes:
    try:
        value = bytes.fromhex(request.text(name))
    except ValueError:
        value = b""
    if len(value) != size:
        raise S3Error(ErrorCode.AccessDenied, f"{name} must be {size} bytes of hex", extra={"ArgumentName": name})
    return value
