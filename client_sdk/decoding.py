"""Decoding compressed chunks in the SDK (``fetch_layers(..., decode="client")``, or ``"auto"`` when the node picks the
client; http and rdma).

The node then sends each chunk's layer slice as stored (an ENCODED frame over http; over rdma the layer's slices
packed into its place, a PACKED frame, copied out first); this process decodes it
straight into its place in the destination on a bounded pool of its own threads (zstd and numpy
release the GIL), apart from the engine's compute thread. A layer is handed to the caller only
when every slice of it is decoded; at most ``2 × threads`` slices wait in memory, so a fast link
cannot outrun the decoders without bound.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from awscrt.checksums import crc32c

from protocol.codecs import CodecError
from protocol.compressed_chunk import SLICE_HEAD, bad_chunk, unpack_slice_head
from protocol.errors import ErrorCode, S3Error


class SliceDecoder:
    """The client's decode pool, shared by its fetches."""

    def __init__(self, threads: int = 2) -> None:
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._bytes = 0  # decoded bytes and thread-seconds so far: the rate decode="auto" tells the node
        self._busy_s = 0.0

    @property
    def bytes_per_s_per_core(self) -> float:
        """Measured decoded bytes per second on one thread (0 before the first decode)."""
        with self._lock:
            return self._bytes / self._busy_s if self._busy_s > 0 else 0.0

    def decode(self, what: str, payload: bytes, dest: memoryview, checksum: int | None) -> None:
        """:func:`decode_slice`, timed."""
        t = time.perf_counter()
        decode_slice(what, payload, dest, checksum)
        with self._lock:
            self._bytes += len(dest)
            self._busy_s += time.perf_counter() - t

    def pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="oc-decode")
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def decode_slice(what: str, payload: bytes, dest: memoryview, checksum: int | None) -> None:
    """One ENCODED frame's payload decoded into ``dest`` (the slice's S bytes); ``checksum``: verify the encoded bytes."""
    codec, dtype, layout = unpack_slice_head(what, payload)
    body = memoryview(payload)[SLICE_HEAD.size :]
    if checksum is not None and crc32c(body) != checksum:
        raise S3Error(ErrorCode.BadDigest, f"{what}: the encoded slice failed its CRC32C check")
    if layout.nbytes(dtype) != len(dest):
        raise bad_chunk(what, "layout", f"decodes to {layout.nbytes(dtype)} bytes, the slice is {len(dest)}")
    try:
        codec.decode(body, np.frombuffer(dest, np.uint8), dtype, layout)
    except CodecError as e:
        raise bad_chunk(what, e.field, str(e)) from None


class LayerDecodes:
    """The decodes of the layer being received: started as frames arrive, all awaited before the layer is handed out."""

    def __init__(self, decoder: SliceDecoder) -> None:
        self.decoder = decoder
        self.pending: list[asyncio.Future] = []
        self._threads: list[concurrent.futures.Future] = []  # the same work, as the pool sees it (for drain)

    async def start(self, what: str, payload: bytes, dest: memoryview, checksum: int | None) -> None:
        if len(self.pending) >= 2 * self.decoder.threads:
            await self.pending.pop(0)  # bounded: wait for the oldest before taking more bytes in
        work = self.decoder.pool().submit(self.decoder.decode, what, payload, dest, checksum)
        self._threads = [f for f in self._threads if not f.done()] + [work]
        self.pending.append(asyncio.wrap_future(work))

    async def drain(self) -> None:
        """Wait until no decode thread writes any more (errors ignored): before the destination is released or reused,
        even when the caller left early or was cancelled."""
        if self._threads:
            await asyncio.shield(asyncio.to_thread(concurrent.futures.wait, list(self._threads)))

    async def finish(self) -> None:
        """Every decode started so far, done; the first failure raised only once none is still writing."""
        if not self.pending:  # decode="auto" and the node decoded: nothing to wait for on this layer
            return
        pending, self.pending = self.pending, []
        results = await asyncio.gather(*pending, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
