"""The data endpoint: ``http`` kv-gets served straight to the client, without the gateway's relay.

The gateway authenticates a kv-get and asks (``Op.KV_TICKET``) for a ticket
(:mod:`protocol.data_ticket`): this module signs it with a key that never
leaves the process and is drawn afresh at every start, so no secret is shared
with the gateway or the client. On the data listener, a ``kv-get`` request
carries the ticket instead of the tenant and bucket the trusted RPC socket
takes on faith; once the ticket checks out (signature, expiry, first use, the
descriptor's digest) the request runs through the very same kv-get as the
gateway's, and its reply line and frames go to the client's socket.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from protocol.config import StorageServerConfig
from protocol.data_ticket import DataTicket, descriptor_digest
from protocol.errors import ErrorCode, S3Error
from protocol.rpc import MAX_REQUEST_LINE, Op

from .rpc_server import Reply, RpcCall, RpcHandler, RpcServer

log = logging.getLogger("objectcache.storage_server.data")

# Asked first for a ticket to another node's data endpoint (the cluster's peer -> engine path): the grant's
# JSON, or None to serve the kv-get here. Arguments: tenant, bucket, request id, descriptor.
ElsewhereGrant = Callable[[str, str, str, bytes], Awaitable[dict | None]]

# A client that connected must send its whole request within this (the listener faces the network).
REQUEST_TIMEOUT_S = 10.0


class DataEndpoint:
    """Issues tickets (for the gateway's RPC) and serves ticketed kv-gets on ``storage_server.data_listen``."""

    def __init__(self, config: StorageServerConfig, kv_get: RpcHandler, max_body: int, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self._key = secrets.token_bytes(32)
        self._used: dict[str, float] = {}  # nonce -> expiry: a ticket is good for one kv-get
        self._kv_get = kv_get
        self.rpc = RpcServer({Op.KV_GET: self.get}, max_body=max_body, request_timeout_s=REQUEST_TIMEOUT_S, single_request=True)
        self.endpoint = ""  # the address clients are told, once listening
        self.elsewhere: ElsewhereGrant | None = None

    async def listen(self) -> asyncio.AbstractServer | None:
        if not self.config.data_listen:
            return None
        host, _, port = self.config.data_listen.rpartition(":")
        server = await asyncio.start_server(self.rpc.serve_connection, host.strip("[]"), int(port), limit=MAX_REQUEST_LINE)
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
        return self.issue(tenant, bucket, request_id, call.body)

    def issue(self, tenant: str, bucket: str, request_id: str, descriptor: bytes, via: str = "") -> dict:
        """A ticket for this endpoint (empty endpoint: there is none)."""
        if not self.endpoint:
            return {"endpoint": "", "ticket": "", "expires_in_s": 0}
        ttl = self.config.data_ticket_ttl_s
        t = DataTicket(tenant, bucket, request_id, descriptor_digest(descriptor), self.clock() + ttl, secrets.token_hex(12), via)
        return {"endpoint": self.endpoint, "ticket": t.sign(self._key), "expires_in_s": ttl}

    async def get(self, call: RpcCall) -> Reply:
        """A kv-get on the data listener: the ticket stands for the tenant and bucket the gateway vouched for."""
        now = self.clock()
        t = DataTicket.verify(call.field("ticket"), self._key, now)
        if descriptor_digest(call.body) != t.descriptor_sha256:
            raise S3Error(ErrorCode.AccessDenied, "The data ticket was issued for another descriptor.")
        self._used = {n: e for n, e in self._used.items() if e >= now} if len(self._used) > 1024 else self._used
        if t.nonce in self._used:
            raise S3Error(ErrorCode.AccessDenied, "The data ticket was already used; ask the gateway again.")
        self._used[t.nonce] = t.expires
        fields = {"tenant": t.tenant, "bucket": t.bucket, "request_id": t.request_id, **({"via": t.via} if t.via else {})}
        return await self._kv_get(replace(call, request=replace(call.request, fields=fields)))
