"""``rdma``: each layer's slices are written one-sidedly into the client's registered memory, then notified.

The client registers memory with its engine once (``kv-register-rdma``, over the signed
control plane); the descriptor names the region by id and capability token exactly as for
``shm``. The storage server reads slices into registered staging pieces in its own memory
(bounded like ``http``: two pieces of at most 8 MiB), WRITEs each into the client's region at
its layer-major place, and sends LAYER ℓ on the HTTP stream once the write has landed, in
layer order. The HTTP request stays the control plane: errors and END statistics travel there.
Engines: NIXL (UCX: verbs, CMA or TCP); pyverbs is configuration-selectable but not built yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..plan import Staging
from ..regions import Region
from .base import FrameSink, OpenRequest, Transport
from .http import MAX_PIECE_BYTES
from .nixl_engine import NixlEngine


@dataclass
class RemoteRegion(Region):
    """Memory in a client process, writable through ``engine`` to ``agent`` at ``[addr, addr+size)``."""

    engine: NixlEngine = field(repr=False, kw_only=True)
    agent: bytes = field(kw_only=True)
    addr: int = field(kw_only=True)
    device: int = field(default=0, kw_only=True)


class RdmaTransport(Transport):
    name = "rdma"
    buffers_in_rotation = 2
    staging = Staging(in_server=True, pieces_in_rotation=2, max_piece_bytes=MAX_PIECE_BYTES)

    def __init__(self, frames: FrameSink, region: RemoteRegion, base_offset: int, chunk_bytes: int, num_chunks: int, num_layers: int) -> None:
        super().__init__(frames, base_offset, chunk_bytes, num_chunks, num_layers)
        self.region = region
        self._buffers: list[tuple[np.ndarray, object]] = []  # staging piece and its registration
        self._turn = 0
        self._payload: tuple[np.ndarray, object] | None = None
        region.hold()

    @classmethod
    def open(cls, request: OpenRequest) -> "RdmaTransport":
        d, t = request.descriptor, request.descriptor.target
        region = request.regions.resolve(request.tenant, t.region_id, t.token, t.offset, d.payload_bytes, RemoteRegion)
        return cls(request.frames, region, t.offset, d.per_layer_chunk_bytes, len(d.chunk_keys), d.num_layers)

    def _registered(self, nbytes: int) -> tuple[np.ndarray, object]:
        buf = np.empty(nbytes, np.uint8)
        return buf, self.region.engine.register(buf)

    def piece_buffer(self, layer: int, first: int, last: int) -> memoryview:
        nbytes = (last - first) * self.chunk_bytes
        slot = self._turn % self.buffers_in_rotation
        self._turn += 1
        if slot == len(self._buffers):
            self._buffers.append(self._registered(nbytes))
        elif self._buffers[slot][0].nbytes < nbytes:
            self.region.engine.deregister(self._buffers[slot][1])
            self._buffers[slot] = self._registered(nbytes)
        return memoryview(self._buffers[slot][0])[:nbytes]

    def payload_buffer(self) -> memoryview:
        if self._payload is None:
            self._payload = self._registered(self.layer_bytes * self.num_layers)
        return memoryview(self._payload[0])

    async def _write(self, data: memoryview, offset: int) -> None:
        arr = np.frombuffer(data, np.uint8)
        r = self.region
        await r.engine.write(arr.ctypes.data, arr.nbytes, r.agent, r.addr + offset, r.device)

    async def deliver_piece(self, layer: int, first: int, data: memoryview) -> None:
        await self._write(data, self.piece_offset(layer, first))

    async def deliver_payload(self, data: memoryview, checksums: list[int]) -> None:
        await self._write(data, self.base_offset)
        for layer, crc in enumerate(checksums):
            await self.layer_ready(layer, crc)

    def close(self) -> None:
        for _, handle in self._buffers + ([self._payload] if self._payload else []):
            self.region.engine.deregister(handle)
        self._buffers.clear()
        self._payload = None
        self.region.release()
