"""Client memory the node may write into: shm tickets, RDMA registrations, and their removal.

An shm registration is two steps: a ticket here, then the memory handed over on the hand-over
socket beside the RPC socket (:mod:`protocol.shm`). An RDMA registration names memory the
client registered with its engine (``storage_server.rdma_engine``: NIXL, whose client must
prove it owns that memory by a value read from it, or pyverbs, connected through the client's
queue pair); the node then admits a region for that tenant only. Engines are created on first use: a node nobody registers with over RDMA
opens no device.
"""

from __future__ import annotations

import base64
from typing import Any

from protocol.config import Config
from protocol.errors import ErrorCode, S3Error
from protocol.kv_http import RdmaRegisterRequest, RegisterReply, RegisterRequest, RegisterTicket, UnregisterRequest, hex_field, proof_bytes
from protocol.pyverbs_device import PyverbsDevice, verbs_available
from protocol.verbs import VerbsDevice

from .regions import RegionRegistry
from .rpc_server import Reply, RpcCall
from .transfer_info import VerbsOpener
from .transports.nixl_engine import NixlEngine, NixlLink
from .transports.rdma import RdmaLink, RemoteRegion
from .transports.verbs_engine import VerbsEngine


def open_pyverbs(name: str) -> VerbsDevice:
    ok, why = verbs_available()
    if not ok:
        raise S3Error(ErrorCode.NotImplemented, f"The rdma transport's pyverbs engine cannot run on this storage server: {why}.")
    return PyverbsDevice(name)


def handover_socket_path(config: Config) -> str:
    """The shm hand-over socket lives beside the RPC socket."""
    return f"{config.rpc_socket}-shm"


class Registrations:
    """The KV_REGISTER, KV_REGISTER_RDMA and KV_UNREGISTER operations over the node's :class:`RegionRegistry`."""

    def __init__(self, config: Config, regions: RegionRegistry, open_verbs: VerbsOpener = open_pyverbs) -> None:
        self.config = config
        self.regions = regions
        self.handover_socket = handover_socket_path(config)
        self._nixl: NixlEngine | None = None
        self._verbs: VerbsEngine | None = None
        self._open_verbs = open_verbs

    async def register(self, call: RpcCall) -> Reply:
        """Step 1 of an shm registration: a ticket to hand the memory over with (:mod:`protocol.shm`)."""
        r = RegisterRequest.from_json(_without(call.request.fields, "tenant"))
        ticket = self.regions.offer(call.field("tenant"), r.size, populate=r.populate)
        return RegisterTicket(self.handover_socket, ticket.secret.hex(), ticket.size).to_json()

    async def register_rdma(self, call: RpcCall) -> Reply:
        """Memory a client registered with its RDMA engine: the server may write into it for this tenant only."""
        r = RdmaRegisterRequest.from_json(_without(call.request.fields, "tenant"))
        engine = self.config.storage_server.rdma_engine
        if r.engine != engine:
            raise S3Error(ErrorCode.NotImplemented, f"RDMA engine {r.engine!r} is not this storage server's "
                          f"(storage_server.rdma_engine = {engine!r})", extra={"ArgumentName": "engine"})
        r.check()
        link: RdmaLink
        server_end = None
        if engine == "pyverbs":
            if r.verbs is None:
                raise S3Error(ErrorCode.InvalidArgument, "the pyverbs engine needs the client's queue pair (verbs)", extra={"ArgumentName": "verbs"})
            if self._verbs is None:
                self._verbs = VerbsEngine(self._open_verbs(self.config.storage_server.rdma_device), self.config.storage_server.rdma_timeout_s)
            link, server_end = self._verbs.connect(r.verbs, r.addr, r.size)
        else:
            try:
                metadata = base64.b64decode(r.agent, validate=True)
            except ValueError:
                raise S3Error(ErrorCode.InvalidArgument, "agent is not base64", extra={"ArgumentName": "agent"}) from None
            nixl = self.nixl_engine()
            name = nixl.add_client(metadata, call.field("tenant"))
            try:
                await nixl.verify(name, r.addr, r.device, hex_field("proof", r.proof, proof_bytes(r.size)))
            except BaseException:
                nixl.forget(name)
                raise
            link = NixlLink(nixl, name, r.addr, r.size, r.device, metadata)
        tenant = call.field("tenant")
        try:
            region = self.regions.admit(lambda rid, token: RemoteRegion(rid, token, tenant, r.size, link=link, addr=r.addr), tenant)
        except BaseException:
            link.close()
            raise
        return RegisterReply(region.region_id.hex(), region.token.hex(), region.size, server_end).to_json()

    def nixl_engine(self) -> NixlEngine:
        """This server's NIXL agent (created on first use: a client's registration, or a peer's write for one)."""
        if self._nixl is None:
            self._nixl = NixlEngine(timeout_s=self.config.storage_server.rdma_timeout_s)
        return self._nixl

    async def unregister(self, call: RpcCall) -> Reply:
        r = UnregisterRequest.from_json(_without(call.request.fields, "tenant"))
        self.regions.unregister(call.field("tenant"), hex_field("region_id", r.region_id), hex_field("token", r.token))
        return {}

    @property
    def rdma_agents(self) -> int:
        return len(self._nixl.known) if self._nixl is not None else 0

    def close(self) -> None:
        if self._verbs is not None:
            self._verbs.close()


def _without(fields: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if k != name}
