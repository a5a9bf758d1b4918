"""A kv-get's layers as the caller receives them: frames in, ``(layer, view)`` out, in layer order."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from awscrt.checksums import crc32c

from protocol.errors import ErrorCode, S3Error
from protocol.kv_http import HEADER_GATEWAY_S, HEADER_MODE, HEADER_PAYLOAD_BYTES
from protocol.packed_layer import unpack as unpack_packed
from protocol.wire import Frame, FrameType, TransferStats

from .decoding import LayerDecodes
from .direct import DirectFrameStream
from .frames import FrameStream
from .layout import KVLayout


@dataclass
class FetchStats:
    """One fetch as the client saw it, plus the server's END-frame report."""

    request_id: str = ""
    transport: str = ""
    direct: bool = False  # http: the frames came from the storage server's data endpoint, not the gateway's relay
    gateway_s: float = 0.0
    client_total_s: float = 0.0
    # When each layer was handed to the caller, seconds from the request (the client's half of the per-layer timeline).
    layer_arrival_s: list[float] = field(default_factory=list)
    # The END report of the stream that completed the kv-get (after a failover: the layers it sent).
    server: TransferStats = field(default_factory=TransferStats)
    # Peer streams (http, direct) that broke or stalled mid-kv-get and were resumed through this client's node: how
    # many, and per broken path ("peer:<node id>") how many layers the caller had from it before it broke.
    failovers: int = 0
    broken_paths: dict[str, int] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        return self.server.mode

    @property
    def first_layer_s(self) -> float | None:
        """When layer 0 was handed to the caller, seconds from the request (None before it was)."""
        return self.layer_arrival_s[0] if self.layer_arrival_s else None


# How often one kv-get is resumed after a peer's stream broke (each time through the client's node, which may
# hand it to another peer) before the error reaches the caller.
MAX_RESUMES = 3
Resume = Callable[[int], Awaitable[tuple[Any, "FrameStream | DirectFrameStream"]]]


class LayerDigests:
    """Each layer's CRC32C, computed piece by piece as the bytes arrive (while they are still in cache).

    DATA frames come in payload order; should one not continue where the last
    ended, the digests give up and each layer is checked whole once it is ready.
    """

    def __init__(self, layer_bytes: int, start: int = 0) -> None:
        self.layer_bytes = layer_bytes
        self._pos = start  # payload offset the next byte must come from; -1: out of order, gave up
        self._crc = 0
        self._done: dict[int, int] = {}

    def start(self, offset: int) -> None:
        """A DATA frame begins at ``offset``."""
        if offset != self._pos:
            self._pos = -1

    def received(self, piece: memoryview) -> None:
        """The next bytes of the current DATA frame, just received."""
        while self._pos >= 0 and piece:
            layer_end = (self._pos // self.layer_bytes + 1) * self.layer_bytes
            k = min(len(piece), layer_end - self._pos)
            self._crc = crc32c(piece[:k], self._crc)
            self._pos += k
            piece = piece[k:]
            if self._pos == layer_end:
                self._done[self._pos // self.layer_bytes - 1], self._crc = self._crc, 0

    def checksum(self, layer: int, view: memoryview) -> int:
        c = self._done.pop(layer, None)
        return crc32c(view) if c is None else c


def finish_after(arrivals_s: list[float], num_layers: int, budget_s: float) -> bool:
    """Whether layers landing at the pace of the last ones (``arrivals_s``, since the request) put the last one in place
    after ``budget_s`` (pure): then the load is given up at once, as the node gives up a layer it cannot start in time."""
    k = len(arrivals_s)
    if k < 2 or k >= num_layers:
        return False
    pace = (arrivals_s[-1] - arrivals_s[0]) / (k - 1)
    return arrivals_s[-1] + (num_layers - k) * pace > budget_s


def budget_exceeded(layer: int, budget_s: float) -> S3Error:
    """The load budget ran out on the caller's clock before ``layer`` was in place: what the node answers when it cuts a
    transfer, raised here too, since the node's clock starts only when the request reaches it."""
    return S3Error(ErrorCode.KVLoadBudgetExceeded,
                   f"layer {layer} was not in place within the load budget of {budget_s:g} s (load_budget_s, this process's "
                   "clock); the layers before it were delivered", extra={"Field": "load_budget_s", "LayerBoundary": str(layer)})


class LayerStream:
    """Async iterator of ``(layer, view)`` in layer order, each as soon as it has landed.

    ``view`` is the layer's ``N·S`` bytes (chunk j at ``j·S``). Views stay valid
    until the ``fetch_layers`` block exits. ``payload`` is the whole ``[L][N][S]``.
    """

    def __init__(self, frames: FrameStream | DirectFrameStream, response: aiohttp.ClientResponse, payload: memoryview, layer_bytes: int,
                 num_layers: int, transport: str, verify: bool, started: float, landed: Callable[[int], Awaitable[None]] | None = None,
                 decodes: LayerDecodes | None = None, slice_bytes: int = 0, resume: Resume | None = None,
                 deadline: float | None = None) -> None:
        self._frames = frames
        self._deadline = deadline  # perf_counter time by which every layer must be in place (the load budget), or None
        self._resume = resume  # asks the client's node again for the layers from one on (a peer's direct stream broke)
        self._resumes_left = MAX_RESUMES
        self._from_layer = 0  # the first layer the current stream sends
        self._decodes = decodes  # decode="client": ENCODED frames decoded here, slices of slice_bytes
        self._slice_bytes = slice_bytes
        self._landed = landed
        self.payload = payload
        self.layer_bytes = layer_bytes
        self.num_layers = num_layers
        self.verify = verify
        # DATA frames are checked per layer; a layer sent as ENCODED frames (each with its own CRC) is not.
        self._digests = LayerDigests(layer_bytes) if verify and layer_bytes else None
        self._encoded_layer = False
        self._next = 0
        self._done = False
        self._started = started
        self.stats = FetchStats(
            request_id=response.headers.get("x-amz-request-id", ""),
            transport=transport,
            gateway_s=float(response.headers.get(HEADER_GATEWAY_S, "0")),
            server=TransferStats(mode=response.headers.get(HEADER_MODE, ""), payload_bytes=int(response.headers.get(HEADER_PAYLOAD_BYTES, "0"))),
        )
        if isinstance(frames, DirectFrameStream) and frames.accepted is not None:
            self.stats.direct = True
            self.stats.server = TransferStats(mode=frames.accepted.mode, payload_bytes=frames.accepted.payload_bytes)

    def __aiter__(self) -> "LayerStream":
        return self

    @property
    def ended(self) -> bool:
        """The stream's END or ERROR frame was read: the server no longer writes into the destination."""
        return self._done

    def layer(self, index: int) -> memoryview:
        return self.payload[index * self.layer_bytes : (index + 1) * self.layer_bytes]

    def as_array(self, layout: KVLayout) -> np.ndarray:
        """The payload as ``(L, N, 2, G, n_kv, d)`` of the layout's dtype (bfloat16 as uint16)."""
        n = self.layer_bytes // layout.per_layer_chunk_bytes
        arr = np.frombuffer(self.payload, dtype=layout.numpy_dtype)
        return arr.reshape(layout.num_layers, n, 2, layout.chunk_tokens, layout.kv_heads, layout.head_dim)

    async def __anext__(self) -> tuple[int, memoryview]:
        if self._deadline is None:
            return await self._next_or_resumed()
        if not self._done and time.perf_counter() >= self._deadline:  # a layer already buffered is read without suspending
            raise budget_exceeded(self._next, self._deadline - self._started)
        try:
            async with asyncio.timeout_at(asyncio.get_running_loop().time() + self._deadline - time.perf_counter()):
                got = await self._next_or_resumed()
        except TimeoutError:
            if self._done:
                raise StopAsyncIteration from None
            raise budget_exceeded(self._next, self._deadline - self._started) from None
        if finish_after(self.stats.layer_arrival_s, self.num_layers, self._deadline - self._started):
            raise budget_exceeded(got[0], self._deadline - self._started)  # the recompute can start now, not at the deadline
        return got

    async def _next_or_resumed(self) -> tuple[int, memoryview]:
        try:
            while True:
                try:
                    return await self._next_layer()
                except S3Error:
                    if not await self._resumed():
                        raise
        except aiohttp.ClientError as e:
            # Not retried: layers may already be in the caller's hands; the caller decides (fetch again).
            raise S3Error(ErrorCode.ServiceUnavailable, f"the KV stream broke after {self._next} of {self.num_layers} layers "
                          f"({type(e).__name__}: {e}); it is not retried, fetch again") from None

    async def _resumed(self) -> bool:
        """After a peer's direct stream broke or stalled: the layers from the next one on, asked again of the
        client's node (which serves them itself or through another peer). The broken stream is closed first, so
        none of its bytes lands after its replacement began; the layers already handed out are never rewritten."""
        old = self._frames
        grant = old.grant if isinstance(old, DirectFrameStream) else None
        if self._resume is None or grant is None or not grant.peer or not old.broken or self._resumes_left <= 0:  # type: ignore[union-attr]
            return False
        self._resumes_left -= 1
        old.close()  # type: ignore[union-attr]
        if self._decodes is not None:  # slices of the broken layer still decoding: none writes once the new stream begins
            await asyncio.gather(*self._decodes.abandon(), return_exceptions=True)
            await self._decodes.drain()
        path = f"peer:{grant.peer}"
        self.stats.failovers += 1
        self.stats.broken_paths[path] = self.stats.broken_paths.get(path, 0) + self._next - self._from_layer
        response, self._frames = await self._resume(self._next)
        self._from_layer = self._next
        if self._digests is not None:
            self._digests = LayerDigests(self.layer_bytes, self._next * self.layer_bytes)
        direct = isinstance(self._frames, DirectFrameStream)
        self.stats.direct = direct
        if direct and self._frames.accepted is not None:  # type: ignore[union-attr]
            self.stats.server = TransferStats(mode=self._frames.accepted.mode, payload_bytes=self._frames.accepted.payload_bytes)  # type: ignore[union-attr]
        elif not direct:
            self.stats.server = TransferStats(mode=response.headers.get(HEADER_MODE, ""), payload_bytes=int(response.headers.get(HEADER_PAYLOAD_BYTES, "0")))
        return True

    async def _next_layer(self) -> tuple[int, memoryview]:
        while not self._done:
            frame = await self._frames.next_frame()
            if frame is None:
                raise S3Error(ErrorCode.ServiceUnavailable, "The KV stream ended before its END frame (the storage server may have stopped).")
            if frame.type == FrameType.DATA:
                start = frame.offset
                if start < 0 or start + frame.length > len(self.payload):
                    raise S3Error(ErrorCode.InternalError, "DATA frame outside the destination")
                digests = self._digests
                if digests is not None:
                    digests.start(start)
                await self._frames.read_into(self.payload[start : start + frame.length], frame.length, digests.received if digests else None)
            elif frame.type == FrameType.ENCODED:
                await self._encoded(frame)
            elif frame.type == FrameType.PACKED:
                return await self._packed(frame)
            elif frame.type == FrameType.LAYER:
                if frame.layer != self._next:
                    raise S3Error(ErrorCode.InternalError, f"layer {frame.layer} arrived before layer {self._next}")
                if self._decodes is not None:
                    await self._decodes.finish()  # the layer is handed out only once every slice of it is decoded
                if self._landed is not None:
                    await self._landed(frame.layer)
                view = self.layer(frame.layer)
                encoded, self._encoded_layer = self._encoded_layer, False
                if self._digests is not None and not encoded and self._digests.checksum(frame.layer, view) != frame.checksum:
                    raise S3Error(ErrorCode.BadDigest, f"layer {frame.layer} failed its CRC32C check")
                self._next += 1
                self.stats.layer_arrival_s.append(time.perf_counter() - self._started)
                return frame.layer, view
            elif frame.type == FrameType.END:
                self.stats.server = TransferStats.from_json(await self._frames.read_json(frame))
                self.stats.request_id = self.stats.request_id or self.stats.server.request_id  # the session path: the node's id
                self.stats.client_total_s = time.perf_counter() - self._started
                self._done = True
                if self._next != self.num_layers:
                    raise S3Error(ErrorCode.InternalError, f"END after {self._next} of {self.num_layers} layers")
            elif frame.type == FrameType.ERROR:
                error = S3Error.from_dict(await self._frames.read_json(frame))
                self._done = True  # only once its payload is read: a kept connection must carry nothing unread
                if self._decodes is not None:
                    await asyncio.gather(*self._decodes.abandon(), return_exceptions=True)
                raise error
        raise StopAsyncIteration

    async def _packed(self, frame: Frame) -> tuple[int, memoryview]:
        """A PACKED frame (rdma, the client decodes): the layer's slices as stored landed in its own place; copied
        out, then each decoded into its place on the decode pool, and the layer handed out once all are."""
        s = self._slice_bytes
        if self._decodes is None or s <= 0:
            raise S3Error(ErrorCode.InternalError, "PACKED frame in a kv-get that did not ask to decode")
        if frame.layer != self._next:
            raise S3Error(ErrorCode.InternalError, f"layer {frame.layer} arrived before layer {self._next}")
        view = self.layer(frame.layer)
        if frame.length > len(view):
            raise S3Error(ErrorCode.InternalError, f"PACKED frame of {frame.length} bytes for a layer of {len(view)}")
        if self._landed is not None:
            await self._landed(frame.layer)
        packed = bytes(view[: frame.length])  # the slices decode into this same place
        for j, (data, crc) in enumerate(unpack_packed(f"layer {frame.layer}", memoryview(packed), self.layer_bytes // s)):
            await self._decodes.start(f"layer {frame.layer} chunk #{j}", data, view, j * s, crc if self.verify else None)
        await self._decodes.finish()
        self._next += 1
        self.stats.layer_arrival_s.append(time.perf_counter() - self._started)
        return frame.layer, view

    async def _encoded(self, frame: Frame) -> None:
        """An ENCODED frame: its slice decoded into ``[offset, offset + S)`` on the decode pool."""
        s = self._slice_bytes
        start = frame.offset
        if self._decodes is None or s <= 0:
            raise S3Error(ErrorCode.InternalError, "ENCODED frame in a kv-get that did not ask to decode")
        if start < 0 or start % s or start + s > len(self.payload) or start // self.layer_bytes != frame.layer:
            raise S3Error(ErrorCode.InternalError, f"ENCODED frame at {start} is not a slice of layer {frame.layer} in the destination")
        self._encoded_layer = True
        payload = await self._frames.read_payload(frame.length)
        what = f"layer {frame.layer} chunk #{(start % self.layer_bytes) // s}"
        await self._decodes.start(what, payload, self.payload, start, frame.checksum if self.verify else None)
