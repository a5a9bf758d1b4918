"""``shm``: the client and the storage server share a registered memory region on one host.

Range reads land directly in the region (``preadv`` into the mapped view: no
intermediate copy), a whole layer at a time; delivery is a small LAYER frame.
"""

from __future__ import annotations

from ..regions import MappedRegion
from .base import FrameSink, OpenRequest, Transport


class ShmTransport(Transport):
    name = "shm"
    reads_into_destination = True
    notify_only = True

    def __init__(self, frames: FrameSink, region: MappedRegion, base_offset: int, chunk_bytes: int, num_chunks: int, num_layers: int) -> None:
        super().__init__(frames, base_offset, chunk_bytes, num_chunks, num_layers)
        self.region = region
        region.hold()

    @classmethod
    def open(cls, request: OpenRequest) -> "ShmTransport":
        d, t = request.descriptor, request.descriptor.target
        region = request.regions.resolve(request.tenant, t.region_id, t.token, t.offset, d.payload_bytes, MappedRegion)
        return cls(request.frames, region, t.offset, d.per_layer_chunk_bytes, len(d.chunk_keys), d.num_layers)

    def piece_buffer(self, layer: int, first: int, last: int) -> memoryview:
        start = self.piece_offset(layer, first)
        return self.region.view[start : start + (last - first) * self.chunk_bytes]

    def payload_buffer(self) -> memoryview:
        return self.region.view[self.base_offset : self.base_offset + self.layer_bytes * self.num_layers]

    async def deliver_payload(self, data: memoryview, checksums: list[int]) -> None:
        for layer, crc in enumerate(checksums):
            await self.layer_ready(layer, crc)

    def close(self) -> None:
        self.region.release()
