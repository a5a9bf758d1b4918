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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from protocol.wire import Descriptor, FrameType, json_frame, pack_frame

from ..plan import Staging
from ..regions import RegionRegistry
from ..staging_buffers import StagingBuffers


class FrameSink:
    """Where frames go: the storage-server RPC stream the gateway relays to the client."""

    def __init__(self, writer: asyncio.StreamWriter, stall_s: float | None = None,
                 pace: Callable[[int], Awaitable[None]] | None = None) -> None:
        self.writer = writer
        self.pace = pace  # a byte-rate cap this stream shares with others (a kv-get served on a peer's behalf)
        # A written memoryview stays referenced by the transport until it is flushed
        # (uvloop does not copy it), and layer buffers are reused once sent: so drain()
        # must mean "flushed". With both marks at 0 it waits until nothing is queued.
        writer.transport.set_write_buffer_limits(high=0, low=0)
        self.stall_s = stall_s

    async def send(self, *pieces: bytes | memoryview) -> None:
        if self.pace is not None:
            await self.pace(sum(len(p) for p in pieces))
        for p in pieces:
            self.writer.write(p)
        await self._flushed()

    def send_now(self, frame: bytes) -> bool:
        """Write a small frame without awaiting, where nothing is queued ahead of it and no pace applies; False: use
        :meth:`send`. Whatever the socket did not take at once is flushed by the caller's next :meth:`flushed`."""
        transport = self.writer.transport
        if self.pace is not None or transport.is_closing() or transport.get_write_buffer_size():
            return False
        self.writer.write(frame)
        return True

    def queued(self) -> bool:
        """Bytes written that the socket has not taken yet (the receiver is behind)."""
        return bool(self.writer.transport.get_write_buffer_size())

    async def flushed(self) -> None:
        await self._flushed()

    async def _flushed(self) -> None:
        """Wait until everything written has left; a receiver that takes no byte for ``stall_s`` is cut off:
        the connection is aborted (dropping what it still queues, which references staging buffers) and
        ``ConnectionAbortedError`` ends the transfer, releasing its staging."""
        transport = self.writer.transport
        if not transport.get_write_buffer_size() and not transport.is_closing():
            return  # the socket took it all: nothing to wait for (a drain under the stall bound was a task and a loop turn)
        if self.stall_s is None:
            await self.writer.drain()
            return
        queued = transport.get_write_buffer_size()
        while True:
            try:
                await asyncio.wait_for(self.writer.drain(), self.stall_s)
                return
            except asyncio.TimeoutError:
                now = transport.get_write_buffer_size()
                if now < queued:  # slow but moving: keep waiting
                    queued = now
                    continue
                transport.abort()
                raise ConnectionAbortedError(f"the receiver took no bytes for {self.stall_s:g} s") from None

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
    staging_buffers: StagingBuffers | None = None  # staging kept between transfers (http); None: made per transfer


class Transport(abc.ABC):
    """Destination memory plus delivery for one transfer.

    Layerwise, the executor reads each layer in pieces (runs of whole chunks)
    into :meth:`piece_buffer`, hands each to :meth:`deliver_piece` and, after a
    layer's last piece, calls :meth:`layer_ready`. Chunkwise, it reads the whole
    payload into :meth:`payload_buffer` and calls :meth:`deliver_payload`.
    """

    name: str
    staging: Staging = Staging(in_server=False)
    # How many piece buffers rotate (one is reused only after its piece was delivered); 0 = none reused.
    buffers_in_rotation: int = 0
    # Tags this transfer's out-of-band layer notifications (rdma over pyverbs); 0 = none.
    tag: int = 0
    # Piece buffers are the client's own memory (not staging), so cold chunks may be read straight into them.
    reads_into_destination: bool = False
    # Delivering a piece is nothing and a layer's readiness one LAYER frame (shm): see :meth:`layer_ready_now`.
    notify_only: bool = False
    # Piece buffers are staging memory allocated page-aligned, so cold chunks may be read into them with O_DIRECT too
    # (a whole layer per piece, one layer at a time through the rotating buffers).
    aligned_staging: bool = False

    def __init__(self, frames: FrameSink, base_offset: int, chunk_bytes: int, num_chunks: int, num_layers: int) -> None:
        self.frames = frames
        self.base_offset = base_offset
        self.chunk_bytes = chunk_bytes  # S: one chunk's slice of one layer
        self.layer_bytes = chunk_bytes * num_chunks
        self.num_layers = num_layers

    @classmethod
    @abc.abstractmethod
    def open(cls, request: OpenRequest) -> "Transport":
        """The transport for one transfer (checks the client's capability where there is one)."""

    def layer_offset(self, layer: int) -> int:
        return self.base_offset + layer * self.layer_bytes

    def piece_offset(self, layer: int, first: int) -> int:
        """Where chunk ``first`` of ``layer`` lands in the destination."""
        return self.layer_offset(layer) + first * self.chunk_bytes

    @abc.abstractmethod
    def piece_buffer(self, layer: int, first: int, last: int) -> memoryview:
        """Memory for slice ``layer`` of chunks first..last-1. Valid until that piece is delivered."""

    @abc.abstractmethod
    def payload_buffer(self) -> memoryview:
        """Memory for the whole [L][N][S] payload (chunkwise mode)."""

    async def deliver_piece(self, layer: int, first: int, data: memoryview) -> None:
        """Make a piece visible to the client (nothing to do where it was read into the client's memory)."""

    async def layer_ready(self, layer: int, checksum: int) -> None:
        """Notify the client that ``layer`` is complete, in layer order."""
        await self.frames.layer_ready(layer, self.layer_offset(layer), self.layer_bytes, checksum)

    def layer_ready_now(self, layer: int, checksum: int) -> bool:
        """:meth:`layer_ready` written at once, no task and no await (``notify_only`` transports, nothing queued ahead
        of it); False: await :meth:`layer_ready` instead."""
        return self.notify_only and self.frames.send_now(pack_frame(FrameType.LAYER, layer, self.layer_offset(layer), self.layer_bytes, checksum))

    async def deliver_payload(self, data: memoryview, checksums: list[int]) -> None:
        """Chunkwise: the whole payload, then every layer's notification at the end."""
        for layer, crc in enumerate(checksums):
            await self.deliver_piece(layer, 0, data[layer * self.layer_bytes : (layer + 1) * self.layer_bytes])
            await self.layer_ready(layer, crc)

    def close(self) -> None:
        """Release buffers and pins."""
