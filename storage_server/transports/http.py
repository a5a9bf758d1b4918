"""``http``: payload bytes travel as DATA frames in the response stream, then a LAYER frame per layer.

Layers are staged in this server in bounded pieces (runs of whole chunks, at most
``MAX_PIECE_BYTES`` and at most half the staging budget each, see
:mod:`storage_server.plan`); two piece buffers alternate, so the read of one
piece overlaps the sending of the previous one, and a transfer's staging memory
never depends on how large a layer is. The two buffers come from, and go back to, the node's kept
staging (:mod:`storage_server.staging_buffers`: per tenant, faulted in once).

A resumed kv-get (descriptor ``first_layer`` = k: the stream that served it broke after the client had layers
0..k-1) sends nothing for the layers before k: they are still read (from this node's cache, cheap beside the
link), but no frame of them leaves, so the link carries only what the client is missing.
"""

from __future__ import annotations

import mmap

from protocol.wire import FrameType, pack_frame

from ..plan import Staging
from ..staging_buffers import StagingBuffers
from .base import FrameSink, OpenRequest, Transport

MAX_DATA_FRAME = 8 << 20
MAX_PIECE_BYTES = 8 << 20


class HttpTransport(Transport):
    name = "http"
    buffers_in_rotation = 2
    aligned_staging = True
    staging = Staging(in_server=True, pieces_in_rotation=2, max_piece_bytes=MAX_PIECE_BYTES)

    def __init__(self, frames: FrameSink, base_offset: int, chunk_bytes: int, num_chunks: int, num_layers: int, first_layer: int = 0,
                 tenant: str = "", kept: StagingBuffers | None = None) -> None:
        super().__init__(frames, base_offset, chunk_bytes, num_chunks, num_layers)
        self.first_layer = first_layer  # layers before it are the client's already: not sent
        self._buffers: list[mmap.mmap] = []  # page-aligned: O_DIRECT reads land in them
        self._turn = 0
        self._payload: memoryview | None = None
        self._tenant, self._kept = tenant, kept or StagingBuffers(0)

    @classmethod
    def open(cls, request: OpenRequest) -> "HttpTransport":
        d = request.descriptor
        return cls(request.frames, d.target.offset, d.per_layer_chunk_bytes, len(d.chunk_keys), d.num_layers, d.first_layer,
                   request.tenant, request.staging_buffers)

    def piece_buffer(self, layer: int, first: int, last: int) -> memoryview:
        nbytes = (last - first) * self.chunk_bytes
        slot = self._turn % self.buffers_in_rotation
        self._turn += 1
        if slot == len(self._buffers):
            self._buffers.append(self._kept.take(self._tenant, nbytes))
        elif len(self._buffers[slot]) < nbytes:
            self._buffers[slot] = self._kept.take(self._tenant, nbytes)
        return memoryview(self._buffers[slot])[:nbytes]

    def payload_buffer(self) -> memoryview:
        if self._payload is None:
            self._payload = memoryview(bytearray(self.layer_bytes * self.num_layers))
        return self._payload

    async def _send_data(self, offset: int, data: memoryview) -> None:
        for i in range(0, len(data), MAX_DATA_FRAME):
            piece = data[i : i + MAX_DATA_FRAME]
            await self.frames.send(pack_frame(FrameType.DATA, 0, offset + i, len(piece)), piece)

    async def deliver_piece(self, layer: int, first: int, data: memoryview) -> None:
        if layer >= self.first_layer:
            await self._send_data(self.piece_offset(layer, first), data)

    async def layer_ready(self, layer: int, checksum: int) -> None:
        if layer >= self.first_layer:
            await super().layer_ready(layer, checksum)

    async def deliver_encoded(self, layer: int, chunk: int, payload: bytes, checksum: int) -> None:
        """Chunk ``chunk``'s slice of ``layer`` as stored, for the client to decode into its place."""
        if layer < self.first_layer:
            return
        await self.frames.send(pack_frame(FrameType.ENCODED, layer, self.piece_offset(layer, chunk), len(payload), checksum), memoryview(payload))

    async def deliver_payload(self, data: memoryview, checksums: list[int]) -> None:
        skip = self.first_layer * self.layer_bytes
        await self._send_data(self.base_offset + skip, data[skip:])
        for layer, crc in enumerate(checksums):
            await self.layer_ready(layer, crc)

    def close(self) -> None:
        if not self.frames.queued():  # else the socket's queue may still send from them: never reused
            for buf in self._buffers:
                self._kept.give(self._tenant, buf)
        self._buffers.clear()
        self._payload = None
