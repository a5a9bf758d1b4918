"""The local fast path: one signed registration per session, then kv-gets straight to the storage server.

An engine on the same host as its node pays the authenticated HTTP request
(SigV4, the gateway, its RPC) once per session instead of once per fetch:

1. ``POST /{bucket}?kv-session`` (signed, through the gateway, which checks the
   bucket is the caller's) returns a :class:`SessionTicket`: the session socket
   (a Unix socket beside the shm hand-over socket) and a one-time ticket.
2. On that socket the engine sends ``{"op": "kv-session-bind", "ticket": …}``;
   the storage server reads the connection's peer credentials (``SO_PEERCRED``)
   and answers a :class:`SessionGrant`: a session id and secret bound to that
   process (pid, uid, gid), that tenant, that bucket (the incarnation the
   gateway checked) and an expiry (``storage_server.session_ttl_s``).
3. Each kv-get is ``{"op": "kv-get", "session": …, "secret": …, "body": n}`` plus
   the descriptor on a new connection to the session socket, from the bound
   process only; the reply line and frames are those of any kv-get, which runs
   through the same code (descriptor limits, region capabilities, fd, staging and
   bandwidth budgets, layer notifications) as the session's tenant and bucket.
"""

from __future__ import annotations

from dataclasses import dataclass

from .kv_http import JsonRecord

SESSION_ID_BYTES = 16
SESSION_SECRET_BYTES = 32
SESSION_TICKET_BYTES = 32
SESSION_TICKET_TTL_S = 30.0  # a registration not bound on the socket within this long is forgotten
MAX_PENDING_SESSIONS_PER_TENANT = 16
# A session request line holds a session id and secret: a stranger's connection buffers no more than this.
MAX_SESSION_LINE = 4096


@dataclass(frozen=True)
class SessionTicket(JsonRecord):
    """The signed registration's answer: where and with what one-time ticket to bind the session."""

    socket: str  # the storage server's session Unix socket
    ticket: str  # hex, SESSION_TICKET_BYTES


@dataclass(frozen=True)
class SessionGrant(JsonRecord):
    """The session capability, good for this process only until it expires."""

    session: str  # hex, SESSION_ID_BYTES
    secret: str  # hex, SESSION_SECRET_BYTES
    expires_in_s: float
