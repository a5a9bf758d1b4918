"""Registration callbacks: the signed halves of registering shm regions, RDMA memory and local fast-path sessions
with the storage server (the destinations and :class:`LocalSession` call them when they need a region or session)."""

from __future__ import annotations

import asyncio
import base64
import json

from protocol.kv_http import KVOp, RdmaRegisterRequest, RegisterReply, RegisterTicket
from protocol.session import SessionTicket

from .buffers import ShmRegion, hand_over
from .signed import SignedRequests, _json


class Registrations(SignedRequests):
    """``kv-register``, ``kv-session`` and ``kv-register-rdma``, as the callbacks the destinations are built with."""

    bucket: str

    async def _register_region(self, region: ShmRegion) -> tuple[bytes, bytes]:
        """Ask for a ticket (signed), then hand the memfd over on this host (:mod:`protocol.shm`)."""
        # populate only when asked, so a server that predates the field still takes plain registrations.
        request = {"size": region.size} | ({"populate": True} if region.prefaulted else {})
        resp = await self._retrying("kv-register", lambda: self._post("/", KVOp.REGISTER, json.dumps(request).encode()))
        ticket = RegisterTicket.from_json(await resp.json())
        assert region.fd is not None
        reply = RegisterReply.from_json(await asyncio.to_thread(hand_over, ticket.socket, bytes.fromhex(ticket.ticket), region.fd))
        return bytes.fromhex(reply.region_id), bytes.fromhex(reply.token)

    async def _register_session(self) -> SessionTicket:
        """The signed half of a local fast-path session (then bound on the session socket by :class:`LocalSession`)."""
        resp = await self._retrying("kv-session", lambda: self._post(f"/{self.bucket}", KVOp.SESSION, b""))
        return SessionTicket.from_json(await resp.json())

    async def _register_rdma(self, metadata: bytes, addr: int, size: int, proof: bytes) -> tuple[bytes, bytes]:
        """Tell the storage server about memory registered with this process's NIXL agent (``proof``: its first bytes)."""
        reply = await self._register_verbs(RdmaRegisterRequest("nixl", addr, size, agent=base64.b64encode(metadata).decode(),
                                                               proof=proof.hex()))
        return bytes.fromhex(reply.region_id), bytes.fromhex(reply.token)

    async def _register_verbs(self, body: RdmaRegisterRequest) -> RegisterReply:
        """kv-register-rdma: memory this process registered with its RDMA engine (and, pyverbs, its queue pair)."""
        resp = await self._post("/", KVOp.REGISTER_RDMA, _json(body))
        return RegisterReply.from_json(await resp.json())
