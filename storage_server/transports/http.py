"""``http``: layer bytes travel as DATA frames in the response stream, then a LAYER frame.

Two staging buffers alternate, so reads of layer ℓ+1 proceed while layer ℓ
is being sent.
"""

from __future__ import annotations

from protocol.wire import FrameType, pack_frame

from ..plan import Staging
from .base import FrameSink, OpenRequest, Transport

MAX_DATA_FRAME = 8 << 20


class HttpTransport(Transport):
    name = "http"
    buffers_in_rotation = 2
    staging = Staging(in_server=True, layers_in_rotation=2)

    def __init__(self, frames: FrameSink, base_offset: int, layer_bytes: int, num_layers: int) -> None:
        super().__init__(frames, base_offset, layer_bytes, num_layers)
        self._buffers: list[memoryview] = []
        self._payload: memoryview | None = None

    @classmethod
    def open(cls, request: OpenRequest) -> "HttpTransport":
        d = request.descriptor
        return cls(request.frames, d.target.offset, d.layer_bytes, d.num_layers)

    def layer_buffer(self, layer: int) -> memoryview:
        while len(self._buffers) < self.buffers_in_rotation:
            self._buffers.append(memoryview(bytearray(self.layer_bytes)))
        return self._buffers[layer % 2]

    def payload_buffer(self) -> memoryview:
        if self._payload is None:
            self._payload = memoryview(bytearray(self.layer_bytes * self.num_layers))
        return self._payload

    async def _send_data(self, offset: int, data: memoryview) -> None:
        for i in range(0, len(data), MAX_DATA_FRAME):
            piece = data[i : i + MAX_DATA_FRAME]
            await self.frames.send(pack_frame(FrameType.DATA, 0, offset + i, len(piece)), piece)

    async def deliver(self, layer: int, data: memoryview, checksum: int) -> None:
        await self._send_data(self.layer_offset(layer), data)
        await self.frames.layer_ready(layer, self.layer_offset(layer), self.layer_bytes, checksum)

    async def deliver_payload(self, data: memoryview, checksums: list[int]) -> None:
        await self._send_data(self.base_offset, data)
        for layer, crc in enumerate(checksums):
            await self.frames.layer_ready(layer, self.layer_offset(layer), self.layer_bytes, crc)

    def close(self) -> None:
        self._buffers.clear()
        self._payload = None
