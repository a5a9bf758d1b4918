"""Decoding compressed chunks in the SDK (``fetch_layers(..., decode="client")``, or ``"auto"`` when the node picks the
client; http and rdma).

The node then sends each chunk's layer slice as stored (an ENCODED frame over http; over rdma the layer's slices
packed into its place, a PACKED frame, copied out first); this process decodes it
straight into its place in the destination on a bounded pool of its own threads (zstd and numpy
release the GIL), apart from the engine's compute thread, neighbouring slices a batch at a time
(``BATCH_BYTES``). A layer is handed to the caller only when every slice of it is decoded; at most
``2 × threads`` batches wait in memory, so a fast link cannot outrun the decoders without bound.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from awscrt.checksums import crc32c

from protocol import codecs
from protocol.codecs import CodecError, alike_runs
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

    def decode(self, slices: list[Slice], dest: memoryview) -> None:
        """:func:`decode_slices`, timed."""
        t = time.perf_counter()
        decode_slices(slices, dest)
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


Slice = tuple[str, bytes, "int | None"]  # an ENCODED frame's payload: (what it is, for errors; the bytes; their CRC32C)
# A decode job: neighbouring slices up to this many decoded bytes, decoded in one Codec.decode_many (one numpy pass per
# slice gave the GIL away so often that two decode threads ran at half one thread's speed).
BATCH_BYTES = codecs.BATCH_BYTES


def decode_slices(slices: list[Slice], dest: memoryview) -> None:
    """ENCODED frames' payloads decoded into ``dest``, their slices back to back; each run of slices stored alike is
    dequantised in one call. A slice's ``checksum``, when given, is verified over its encoded bytes."""
    s = len(dest) // len(slices)
    heads = []
    for what, payload, checksum in slices:
        codec, dtype, layout = unpack_slice_head(what, payload)
        body = memoryview(payload)[SLICE_HEAD.size :]
        if checksum is not None and crc32c(body) != checksum:
            raise S3Error(ErrorCode.BadDigest, f"{what}: the encoded slice failed its CRC32C check")
        if layout.nbytes(dtype) != s:
            raise bad_chunk(what, "layout", f"decodes to {layout.nbytes(dtype)} bytes, the slice is {s}")
        heads.append(((codec.id, dtype, layout), codec, body))
    for k, n in alike_runs([kind for kind, _, _ in heads]):
        (_, dtype, layout), codec = heads[k][0], heads[k][1]
        try:
            codec.decode_many([h[2] for h in heads[k : k + n]], np.frombuffer(dest, np.uint8, n * s, k * s), dtype, layout)
        except CodecError as e:
            raise bad_chunk(slices[k + e.index][0], e.field, str(e)) from None


class LayerDecodes:
    """The decodes of the layer being received: started as frames arrive, all awaited before the layer is handed out."""

    def __init__(self, decoder: SliceDecoder, slice_bytes: int) -> None:
        self.decoder = decoder
        self.pending: list[asyncio.Future] = []
        self._slice_bytes = slice_bytes
        self._batch: list[Slice] = []  # slices not handed to the pool yet, landing at base[at : end]
        self._base: memoryview | None = None
        self._at = self._end = 0
        self._threads: list[concurrent.futures.Future] = []  # the same work, as the pool sees it (for drain)

    async def start(self, what: str, payload: bytes, base: memoryview, at: int, checksum: int | None) -> None:
        """Decode ``payload`` into ``base[at : at + S]``: joined to the slices before it where it continues them, the
        batch handed to the pool once it holds BATCH_BYTES (or at :meth:`finish`). A layer of at most BATCH_BYTES is
        decoded once its LAYER frame is in: batches of a quarter of that, decoding while the layer's later frames arrived,
        made a 16 MiB kv-get at 40 Gbps slower (101-105 ms against 65-82)."""
        if self._batch and (base is not self._base or at != self._end):
            await self._submit()
        if not self._batch:
            self._base, self._at = base, at
        self._batch.append((what, payload, checksum))
        self._end = at + self._slice_bytes
        if self._end - self._at >= BATCH_BYTES:
            await self._submit()

    async def _submit(self) -> None:
        batch, self._batch = self._batch, []
        if len(self.pending) >= 2 * self.decoder.threads:
            await asyncio.wait([self.pending[0]])  # bounded: the oldest done before more bytes are taken in
            oldest = self.pending[0]
            if oldest.cancelled() or oldest.exception() is not None:
                return  # the layer fails: finish() raises that once none is writing; nothing more to decode for it
            self.pending.pop(0)
        work = self.decoder.pool().submit(self.decoder.decode, batch, self._base[self._at : self._end])
        self._threads = [f for f in self._threads if not f.done()] + [work]
        self.pending.append(asyncio.wrap_future(work))

    def abandon(self) -> list[asyncio.Future]:
        """The slices not handed to the pool yet are dropped (a broken stream, an error); returns the decodes running."""
        self._batch = []
        pending, self.pending = self.pending, []
        return pending

    async def drain(self) -> None:
        """Wait until no decode thread writes any more (errors ignored): before the destination is released or reused,
        even when the caller left early or was cancelled."""
        if self._threads:
            await asyncio.shield(asyncio.to_thread(concurrent.futures.wait, list(self._threads)))

    async def finish(self) -> None:
        """Every decode started so far, done; the first failure raised only once none is still writing."""
        if self._batch:
            await self._submit()
        if not self.pending:  # decode="auto" and the node decoded: nothing to wait for on this layer
            return
        pending, self.pending = self.pending, []
        results = await asyncio.gather(*pending, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
