"""The data endpoint: ``http`` kv-gets served straight to the client, without the gateway's relay.

The gateway authenticates a kv-get and asks (``Op.KV_TICKET``) for a ticket
(:mod:`protocol.data_ticket`): this module signs it with a key that never
leaves the process and is drawn afresh at every start, so no secret is shared
with the gateway or the client. On the data listener, a ``kv-get`` request
carries the ticket instead of the tenant and bucket the trusted RPC socket
takes on faith; once the ticket checks out (signature, expiry, first use, the
descriptor's digest, and the bucket still the incarnation it was granted for) the request runs through the very same kv-get as the
gateway's, and its reply line and frames go to the client's socket.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from protocol.config import StorageServerConfig
from protocol.data_ticket import DataTicket, descriptor_digest
from protocol.errors import ErrorCode, S3Error
from protocol.rpc import Op, RpcRequest

from .rpc_server import Reply, RpcCall, RpcHandler, RpcServer

log = logging.getLogger("objectcache.storage_server.data")

# A data endpoint request line holds a ticket (a few hundred bytes): a stranger's connection buffers no more than this.
MAX_LINE = 16 * 1024


def connection_cap(configured: int) -> int:
    """``data_max_connections``, kept within a quarter of the fd limit (chunk files and the RPC need the rest)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return max(1, min(configured, soft // 4)) if soft > 0 else configured

# Asked first for a ticket to another node's data endpoint (the cluster's peer -> engine path): the grant's
# JSON, or None to serve the kv-get here. Arguments: tenant, bucket, request id, descriptor.
ElsewhereGrant = Callable[[str, str, str, bytes], Awaitable[dict | None]]


class DataEndpoint:
    """Issues tickets (for the gateway's RPC) and serves ticketed kv-gets on ``storage_server.data_listen``."""

    def __init__(self, config: StorageServerConfig, kv_get: RpcHandler, max_body: int, incarnation: Callable[[str], Awaitable[str]],
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._incarnation = incarnation  # a bucket's current incarnation (NoSuchBucket if there is none)
        self.clock = clock
        self._key = secrets.token_bytes(32)
        self._used: dict[str, float] = {}  # nonce -> expiry: a ticket is good for one kv-get
        self._kv_get = kv_get
        # The ticket is checked from the request line: a stranger's descriptor is never read into memory.
        self.rpc = RpcServer({Op.KV_GET: self.get}, max_body=max_body, request_timeout_s=config.data_request_timeout_s,
                             single_request=True, max_connections=connection_cap(config.data_max_connections),
                             check_header=self.check_ticket, line_limit=MAX_LINE)
        self.endpoint = ""  # the address clients are told, once listening
        self.elsewhere: ElsewhereGrant | None = None

    async def listen(self) -> asyncio.AbstractServer | None:
        if not self.config.data_listen:
            return None
        host, _, port = self.config.data_listen.rpartition(":")
        server = await asyncio.start_server(self.rpc.serve_connection, host.strip("[]"), int(port), limit=MAX_LINE)
        bound = server.sockets[0].getsockname()[1]
        self.endpoint = self.config.data_endpoint or f"{host}:{bound}"
        log.info("data endpoint on %s:%d, advertised as %s", host, bound, self.endpoint)
        return server

    async def ticket(self, call: RpcCall) -> Reply:
        """``Op.KV_TICKET`` (from the gateway, which authenticated the caller): a ticket for this descriptor
        (on a peer's data endpoint when the cluster says so)."""
        tenant, bucket, request_id = call.field("tenant"), call.field("bucket"), str(call.request.fields.get("request_id", ""))
        if self.elsewhere is not None and (grant := await self.elsewhere(tenant, bucket, request_id, call.body)) is not None:
            return grant
        # The incarnation whose ownership the gateway checked; asked here only of a gateway that does not send it.
        incarnation = str(call.request.fields.get("bucket_incarnation") or "") or (await self._incarnation(bucket) if self.endpoint else "")
        return self.issue(tenant, bucket, incarnation, request_id, call.body)

    def issue(self, tenant: str, bucket: str, incarnation: str, request_id: str, descriptor: bytes, via: str = "") -> dict:
        """A ticket for this endpoint (empty endpoint: there is none), bound to ``incarnation`` of ``bucket``."""
        if not self.endpoint:
            return {"endpoint": "", "ticket": "", "expires_in_s": 0}
        ttl = self.config.data_ticket_ttl_s
        t = DataTicket(tenant, bucket, incarnation, request_id, descriptor_digest(descriptor), self.clock() + ttl,
                       secrets.token_hex(12), len(descriptor), via)
        return {"endpoint": self.endpoint, "ticket": t.sign(self._key), "expires_in_s": ttl}

    def check_ticket(self, request: RpcRequest) -> DataTicket:
        """The request line's ticket, if it is good (signature, expiry, not used, the announced body length):
        checked before the body is read."""
        now = self.clock()
        t = DataTicket.verify(request.text("ticket"), self._key, now)
        if t.descriptor_bytes != request.body_bytes:
            raise S3Error(ErrorCode.AccessDenied, f"The data ticket was issued for another descriptor ({t.descriptor_bytes} bytes, "
                          f"not {request.body_bytes}).")
        self._used = {n: e for n, e in self._used.items() if e >= now} if len(self._used) > 1024 else self._used
        if t.nonce in self._used:
            raise S3Error(ErrorCode.AccessDenied, "The data ticket was already used; ask the gateway again.")
        return t

    async def get(self, call: RpcCall) -> Reply:
        """A kv-get on the data listener: the ticket stands for the tenant and bucket the gateway vouched for."""
        t = self.check_ticket(call.request)  # again: another connection may have used it while this body arrived
        if descriptor_digest(call.body) != t.descriptor_sha256:
            raise S3Error(ErrorCode.AccessDenied, "The data ticket was issued for another descriptor.")
        self._used[t.nonce] = t.expires
        try:
            current = await self._incarnation(t.bucket)
        except S3Error as e:
            if e.code != ErrorCode.NoSuchBucket:
                raise
            current = ""
        if current != t.bucket_incarnation:
            raise S3Error(ErrorCode.AccessDenied, f"The data ticket's bucket {t.bucket!r} was deleted since the ticket was issued.")
        fields = {"tenant": t.tenant, "bucket": t.bucket, "request_id": t.request_id, **({"via": t.via} if t.via else {})}
        return await self._kv_get(replace(call, request=replace(call.request, fields=fields)))
