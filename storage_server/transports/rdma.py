"""``rdma``: each layer's slices are written one-sidedly into the client's registered memory, then notified.

The client registers memory with its engine once (``kv-register-rdma``, over the signed
control plane); the descriptor names the region by id and capability token exactly as for
``shm``. The storage server reads slices into registered staging pieces in its own memory
(bounded like ``http``: two pieces of at most 8 MiB), WRITEs each into the client's region at
its layer-major place, and sends LAYER ℓ on the HTTP stream once the write has landed, in
layer order. The HTTP request stays the control plane: errors and END statistics travel there.

A kv-get whose client decodes (CLIENT_DECODES, or DECODE_AUTO's choice) gets each layer's slices as stored,
packed into the layer's own place (:mod:`protocol.packed_layer`) with one WRITE, and a PACKED frame
instead of the LAYER frame.

The region's link is its engine (``storage_server.rdma_engine``): :class:`~.nixl_engine.NixlLink`
(NIXL over UCX: verbs, CMA or TCP) or :class:`~.verbs_engine.VerbsConnection` (an RC queue pair
of its own; each layer is also announced by a WRITE_WITH_IMM tagged with this transfer's tag,
which the client learns from the ``x-oc-rdma-tag`` response header).
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from protocol.errors import ErrorCode, S3Error
from protocol.packed_layer import ENTRY
from protocol.rdma_token import RdmaToken
from protocol.wire import FrameType, pack_frame

from ..plan import Staging
from ..regions import Region
from .base import FrameSink, OpenRequest, Transport
from .http import MAX_PIECE_BYTES


class RdmaLink(Protocol):
    """What the transport needs of an engine for one client region."""

    broken: bool  # the connection failed: the region must be registered again

    def register(self, buf: np.ndarray) -> Any: ...
    def deregister(self, handle: Any) -> None: ...
    def begin(self) -> int: ...
    def matches(self, token: RdmaToken) -> bool:
        """Whether an x-amz-rdma-token's keys name this link's memory (its address range is checked apart)."""
        ...
    async def write(self, local: np.ndarray, handle: Any, offset: int) -> None: ...
    async def notify(self, tag: int, layer: int) -> None: ...
    def close(self) -> None: ...


@dataclass
class RemoteRegion(Region):
    """Memory in a client process at ``[addr, addr+size)``, writable through ``link``."""

    link: RdmaLink = field(repr=False, kw_only=True)
    addr: int = field(kw_only=True)

    def close(self) -> None:
        self.link.close()


class RdmaTransport(Transport):
    name = "rdma"
    buffers_in_rotation = 2
    aligned_staging = True
    staging = Staging(in_server=True, pieces_in_rotation=2, max_piece_bytes=MAX_PIECE_BYTES)

    def __init__(self, frames: FrameSink, region: RemoteRegion, base_offset: int, chunk_bytes: int, num_chunks: int, num_layers: int) -> None:
        super().__init__(frames, base_offset, chunk_bytes, num_chunks, num_layers)
        self.region = region
        self._buffers: list[tuple[np.ndarray, object]] = []  # staging piece and its registration
        self._turn = 0
        self._payload: tuple[np.ndarray, object] | None = None
        self._packed: tuple[np.ndarray, object] | None = None  # the layer being packed (client decodes), registered
        self._packed_layer, self._packed_at = -1, 0
        self.num_chunks = num_chunks
        self.link = region.link
        self.tag = self.link.begin()
        region.hold()

    @classmethod
    def open(cls, request: OpenRequest) -> "RdmaTransport":
        d, t = request.descriptor, request.descriptor.target
        region = request.regions.resolve(request.tenant, t.region_id, t.token, t.offset, d.payload_bytes, RemoteRegion)
        if region.link.broken:
            # Its connection failed earlier: forget it, so the SDK registers afresh (as after a restart).
            if not region.in_use:
                request.regions.unregister(request.tenant, t.region_id, t.token)
            raise S3Error(ErrorCode.KVNoSuchRegion, "the RDMA connection of this region failed; register the memory again",
                          extra={"RegionId": t.region_id.hex()})
        return cls(request.frames, region, t.offset, d.per_layer_chunk_bytes, len(d.chunk_keys), d.num_layers)

    def _registered(self, nbytes: int) -> tuple[np.ndarray, object]:
        """A registered staging buffer, page-aligned (an anonymous mapping) so cold chunks are read into it with O_DIRECT."""
        buf = np.frombuffer(mmap.mmap(-1, max(1, nbytes)), np.uint8)[:nbytes]
        return buf, self.link.register(buf)

    def piece_buffer(self, layer: int, first: int, last: int) -> memoryview:
        nbytes = (last - first) * self.chunk_bytes
        slot = self._turn % self.buffers_in_rotation
        self._turn += 1
        if slot == len(self._buffers):
            self._buffers.append(self._registered(nbytes))
        elif self._buffers[slot][0].nbytes < nbytes:
            self.link.deregister(self._buffers[slot][1])
            self._buffers[slot] = self._registered(nbytes)
        return memoryview(self._buffers[slot][0])[:nbytes]

    def payload_buffer(self) -> memoryview:
        if self._payload is None:
            self._payload = self._registered(self.layer_bytes * self.num_layers)
        return memoryview(self._payload[0])

    def _handle(self, data: memoryview) -> object:
        """The registration of the staging buffer ``data`` is a view of."""
        base = np.frombuffer(data, np.uint8).ctypes.data
        for buf, handle in self._buffers + [b for b in (self._payload, self._packed) if b]:
            if buf.ctypes.data <= base < buf.ctypes.data + buf.nbytes:
                return handle
        raise AssertionError("a piece outside the registered staging buffers")

    async def _write(self, data: memoryview, offset: int) -> None:
        await self.link.write(np.frombuffer(data, np.uint8), self._handle(data), offset)

    async def deliver_piece(self, layer: int, first: int, data: memoryview) -> None:
        await self._write(data, self.piece_offset(layer, first))

    async def layer_ready(self, layer: int, checksum: int) -> None:
        if layer == self._packed_layer and self._packed is not None:  # its slices as stored: one WRITE, then PACKED
            await self._write(memoryview(self._packed[0])[: self._packed_at], self.layer_offset(layer))
            await self.link.notify(self.tag, layer)
            await self.frames.send(pack_frame(FrameType.PACKED, layer, self.layer_offset(layer), self._packed_at, 0))
            return
        await self.link.notify(self.tag, layer)
        await super().layer_ready(layer, checksum)

    async def deliver_encoded(self, layer: int, chunk: int, payload: bytes, checksum: int) -> None:
        """Chunk ``chunk``'s slice of ``layer`` as stored, packed into the layer's buffer (chunks come in order)."""
        if self._packed is None:
            self._packed = self._registered(self.layer_bytes)
        buf = self._packed[0]
        if layer != self._packed_layer:
            self._packed_layer, self._packed_at = layer, ENTRY.size * self.num_chunks
        end = self._packed_at + len(payload)
        if end > self.layer_bytes:  # the node checks every layer fits before it chooses to send slices as stored
            raise S3Error(ErrorCode.InternalError, f"layer {layer}'s slices as stored do not fit in its {self.layer_bytes} bytes")
        buf[self._packed_at : end] = np.frombuffer(payload, np.uint8)
        ENTRY.pack_into(buf, ENTRY.size * chunk, len(payload), checksum)
        self._packed_at = end

    async def deliver_payload(self, data: memoryview, checksums: list[int]) -> None:
        await self._write(data, self.base_offset)
        for layer, crc in enumerate(checksums):
            await self.layer_ready(layer, crc)

    def close(self) -> None:
        for _, handle in self._buffers + [b for b in (self._payload, self._packed) if b]:
            self.link.deregister(handle)
        self._buffers.clear()
        self._payload = self._packed = None
        self.region.release()
