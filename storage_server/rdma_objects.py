"""Plain GETs of whole objects written into a client's registered memory (``x-amz-rdma-token``).

The gateway authorizes the GET and evaluates its conditions, then asks for ``rdma-get-object``
with the token (:mod:`protocol.rdma_token`) and the ETag it saw. The storage server finds the
region this tenant registered through ``kv-register-rdma`` that the token lies in (same
address range; for the pyverbs engine also the rkey and the client's queue pair), opens the
object from its own store, checks it is the version the gateway saw and that it fits, and
writes it through the region's link in registered staging pieces. Anything that does not fit
is a 501 NotImplemented naming why, so a client that follows the convention falls back to a
plain GET; nothing is ever written outside the region the token's tenant registered.
"""

from __future__ import annotations

import numpy as np

from protocol.errors import ErrorCode, S3Error
from protocol.rdma_token import RdmaToken

from .regions import RegionRegistry
from .rpc_server import Reply, RpcCall
from .store import ObjectStore
from .transports.http import MAX_PIECE_BYTES
from .transports.rdma import RemoteRegion


def declined(why: str) -> S3Error:
    return S3Error(ErrorCode.NotImplemented, f"x-amz-rdma-token declined: {why}; GET the object without it")


def find_region(regions: RegionRegistry, tenant: str, token: RdmaToken) -> RemoteRegion:
    """The tenant's registered region the token describes memory inside of."""
    for region in regions.owned(tenant, RemoteRegion):
        inside = region.addr <= token.addr and token.addr + token.size <= region.addr + region.size
        if inside and region.link.matches(token):
            return region
    raise declined("it does not describe memory this tenant registered through kv-register-rdma")


class RdmaObjects:
    def __init__(self, store: ObjectStore, regions: RegionRegistry) -> None:
        self.store = store
        self.regions = regions

    async def get_object(self, call: RpcCall) -> Reply:
        token = RdmaToken.parse(call.field("token"))
        region = find_region(self.regions, call.field("tenant"), token)
        if region.link.broken:
            raise declined("the RDMA connection of the memory it describes failed; register it again")
        reader = await self.store.open_object(call.field("bucket"), call.field("key"))
        region.hold()
        staging, handle = None, None
        try:
            meta = reader.meta
            if meta.etag != call.field("etag"):
                raise S3Error(ErrorCode.PreconditionFailed, "the object changed while the GET was served; retry it")
            if meta.size > token.size:
                raise declined(f"the object is {meta.size} bytes, more than the {token.size} bytes of memory it describes")
            base = token.addr - region.addr
            if meta.size:
                staging = np.empty(min(meta.size, MAX_PIECE_BYTES), np.uint8)
                handle = region.link.register(staging)
                done = filled = 0
                async for chunk in reader.stream(None):
                    data = memoryview(chunk).cast("B")
                    while data.nbytes:
                        take = min(data.nbytes, staging.nbytes - filled)
                        staging[filled : filled + take] = np.frombuffer(data[:take], np.uint8)
                        filled, data = filled + take, data[take:]
                        if filled == staging.nbytes:
                            await region.link.write(staging, handle, base + done)
                            done, filled = done + filled, 0
                if filled:
                    await region.link.write(staging[:filled], handle, base + done)
                    done += filled
                if done != meta.size:
                    raise S3Error(ErrorCode.InternalError, f"read {done} of the object's {meta.size} bytes")
            return {"bytes": meta.size}
        finally:
            if handle is not None:
                region.link.deregister(handle)
            region.release()
            reader.close()
