"""``shm``: the client and the storage server share a registered memory region on one host.

Range reads land directly in the region (``preadv`` into the mapped view: no
intermediate copy); delivery is a small LAYER frame.
"""

from __future__ import annotations

from ..regions import Region
from .base import FrameSink, OpenRequest, Transport


class ShmTransport(Transport):
    name = "shm"

    def __init__(self, frames: FrameSink, region: Region, base_offset: int, layer_bytes: int, num_layers: int) -> None:
        super().__init__(frames, base_offset, layer_bytes, num_layers)
        self.region = region
        region.hold()

    @classmethod
    def open(cls, request: OpenRequest) -> "ShmTransport":
        d, t = request.descriptor, request.descriptor.target
        region = request.regions.resolve(request.tenant, t.region_id, t.token, t.offset, d.payload_bytes)
        return cls(request.frames, region, t.offset, d.layer_bytes, d.num_layers)

    def layer_buffer(self, layer: int) -> memoryview:
        start = self.layer_offset(layer)
        return self.region.view[start : start + self.layer_bytes]

    def payload_buffer(self) -> memoryview:
        return self.region.view[self.base_offset : self.base_offset + self.layer_bytes * self.num_layers]

    async def deliver(self, layer: int, data: memoryview, checksum: int) -> None:
        await self.frames.layer_ready(layer, self.layer_offset(layer), self.layer_bytes, checksum)

    def close(self) -> None:
        self.region.release()
