"""The transport interface: one-sided writes of bytes into the client's destination, then a notification.

The executor asks a transport for the memory a layer (or the whole chunkwise
payload) must be read into, fills it with range reads straight from chunk
files, and then calls :meth:`deliver` — which for ``shm`` only notifies (the
bytes are already in the client's region) and for ``http`` streams the bytes
and then notifies.
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass

from protocol.wire import Descriptor, FrameType, json_frame, pack_frame

from ..plan import Staging
from ..regions import RegionRegistry


class FrameSink:
    """Where frames go: the storage-server RPC stream the gateway relays to the client."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        # A written memoryview stays referenced by the transport until it is flushed
        # (uvloop does not copy it), and layer buffers are reused once sent: so drain()
        # must mean "flushed". With both marks at 0 it waits until nothing is queued.
        writer.transport.set_write_buffer_limits(high=0, low=0)

    async def send(self, *pieces: bytes | memoryview) -> None:
        for p in pieces:
            self.writer.write(p)
        await self.writer.drain()

    async def layer_ready(self, layer: int, offset: int, length: int, checksum: int) -> None:
        await self.send(pack_frame(FrameType.LAYER, layer, offset, length, checksum))

    async def end(self, stats: dict) -> None:
        await self.send(json_frame(FrameType.END, stats))

    async def error(self, err: dict) -> None:
        await self.send(json_frame(FrameType.ERROR, err))


@dataclass(frozen=True)
class OpenRequest:
    """What a transport needs to open for one transfer: its descriptor, whose it is, where frames go."""

    descriptor: Descriptor
    tenant: str
    frames: FrameSink
    regions: RegionRegistry


class Transport(abc.ABC):
    """Destination memory plus delivery for one transfer."""

    name: str
    staging: Staging = Staging(in_server=False)
    # How many layer buffers rotate (a buffer is reused only after its layer was delivered); 0 = none reused.
    buffers_in_rotation: int = 0

    def __init__(self, frames: FrameSink, base_offset: int, layer_bytes: int, num_layers: int) -> None:
        self.frames = frames
        self.base_offset = base_offset
        self.layer_bytes = layer_bytes
        self.num_layers = num_layers

    @classmethod
    @abc.abstractmethod
    def open(cls, request: OpenRequest) -> "Transport":
        """The transport for one transfer (checks the client's capability where there is one)."""

    def layer_offset(self, layer: int) -> int:
        return self.base_offset + layer * self.layer_bytes

    @abc.abstractmethod
    def layer_buffer(self, layer: int) -> memoryview:
        """Memory for layer ``layer`` ([N][S] bytes). Valid until that layer is delivered."""

    @abc.abstractmethod
    def payload_buffer(self) -> memoryview:
        """Memory for the whole [L][N][S] payload (chunkwise mode)."""

    @abc.abstractmethod
    async def deliver(self, layer: int, data: memoryview, checksum: int) -> None:
        """Make layer ``layer`` visible to the client and notify it, in layer order."""

    async def deliver_payload(self, data: memoryview, checksums: list[int]) -> None:
        """Chunkwise: the whole payload, then every layer's notification at the end."""
        for layer, crc in enumerate(checksums):
            view = data[layer * self.layer_bytes : (layer + 1) * self.layer_bytes]
            await self.deliver(layer, view, crc)

    def close(self) -> None:
        """Release buffers and pins."""
