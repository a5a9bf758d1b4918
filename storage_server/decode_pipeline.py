"""The node's staged decode pipeline for compressed chunks (ShadowServe §4.2–4.3, on the node's cores).

A layer piece (a run of chunks of one layer) is split into fixed-size *pieces* of about
``piece_bytes`` decoded bytes, and each piece flows through three stages, each on its own bounded
pool, so piece k+1 is fetched while piece k is decompressed and piece k-1 dequantised:

1. **fetch** (the executor's read pool): one ``pread`` per chunk of its encoded layer slice into the
   piece's slot (raw chunks are read straight into the destination);
2. **decompress** (``compression.decompress_threads``): CRC32C check, then the lossless stage, into
   the slot's intermediate buffer, or for a lossless codec straight into the destination;
3. **dequantise** (``compression.dequantise_threads``): the lossy stage from the intermediate buffer
   into the destination, then the piece's CRC32C while its bytes are hot.

A call whose chunks make one piece has nothing to overlap its stages with: while fewer layers decode than
there are decompress threads, they run one after another in one job there (:func:`_all_stages`, each still metered), one
thread hop instead of three. With more layers decoding than that, the stages keep their own pools.

The destination is the transport's buffer (the engine's shm region, or the http/rdma staging piece):
no copy after the last stage. Slots (encoded + intermediate buffers) are allocated once per pipeline,
grown to the largest piece seen and reused; at most one slot per worker of all stages is in flight,
which bounds the memory. A piece's result is awaited before its layer is reported ready, and when
one piece fails every other in flight finishes first, so no stage is still writing into a buffer the
caller frees.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from awscrt.checksums import crc32c

from protocol.checksums import crc32c_combine
from protocol.codecs import CodecError, alike_runs
from protocol.compressed_chunk import ChunkHeader, bad_chunk
from protocol.errors import ErrorCode, S3Error


@dataclass
class Slot:
    """A piece's pre-allocated buffers: the encoded slices as read, the intermediate between the two decode stages."""

    encoded: bytearray = field(default_factory=bytearray)
    mid: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint8))

    def ensure(self, encoded: int, mid: int) -> None:
        if len(self.encoded) < encoded:
            self.encoded = bytearray(encoded)
        if self.mid.size < mid:
            self.mid = np.empty(mid, np.uint8)


@dataclass
class Piece:
    """Chunks a..b-1 of one layer, landing at ``dest[(j - base)·s]``; where each encoded slice sits in the slot."""

    layer: int
    a: int
    b: int
    base: int
    enc_at: list[int]  # per chunk: offset in slot.encoded (-1: a raw chunk)
    mid_at: list[int]  # per chunk: offset in slot.mid (-1: no lossy stage)


STAGES = ("fetch", "decompress", "dequantise")


@dataclass
class StageMeter:
    """What one stage did: decoded bytes it handled and the thread-seconds it took (so GB/s per worker)."""

    bytes: int = 0
    busy_s: float = 0.0
    pieces: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, nbytes: int, seconds: float) -> None:
        with self._lock:
            self.bytes += nbytes
            self.busy_s += seconds
            self.pieces += 1

    def describe(self, workers: int) -> dict[str, float | int]:
        return {"workers": workers, "pieces": self.pieces, "bytes": self.bytes, "busy_s": round(self.busy_s, 6),
                "gbps_per_worker": round(self.bytes * 8 / self.busy_s / 1e9, 3) if self.busy_s > 0 else 0.0}


def _timed(meter: StageMeter, nbytes: int, fn, *args):
    """Run a stage function on its pool thread, counting its bytes and time."""
    t = time.perf_counter()
    try:
        return fn(*args)
    finally:
        meter.add(nbytes, time.perf_counter() - t)


class DecodePipeline:
    """Three bounded stage pools shared by every transfer of this server; see the module docstring."""

    def __init__(self, fetch_pool: ThreadPoolExecutor, fetch_workers: int, decompress_threads: int, dequantise_threads: int,
                 piece_bytes: int) -> None:
        self.fetch_pool = fetch_pool
        self.decompress_pool = ThreadPoolExecutor(max_workers=decompress_threads, thread_name_prefix="kv-decompress")
        self.dequantise_pool = ThreadPoolExecutor(max_workers=dequantise_threads, thread_name_prefix="kv-dequantise")
        self.piece_bytes = piece_bytes
        self.slots = [Slot() for _ in range(fetch_workers + decompress_threads + dequantise_threads)]
        self.workers = {"fetch": fetch_workers, "decompress": decompress_threads, "dequantise": dequantise_threads}
        self.meters = {stage: StageMeter() for stage in STAGES}
        self._free: asyncio.Queue[Slot] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._decoding = 0  # decode() calls in flight (a one-piece layer runs in one job while the decompress pool has room)

    def status(self) -> dict[str, dict[str, float | int]]:
        """Per stage since start: pieces, decoded bytes, thread-seconds and GB/s per worker (the measured throughput
        to size ``compression.decompress_threads`` / ``dequantise_threads`` by: the slowest stage bounds the pipeline)."""
        return {stage: self.meters[stage].describe(self.workers[stage]) for stage in STAGES}

    def close(self) -> None:
        self.decompress_pool.shutdown(wait=True)
        self.dequantise_pool.shutdown(wait=True)

    def _queue(self) -> asyncio.Queue[Slot]:
        """The free slots, a queue of the running loop (the server has one; a test may run several, one after another)."""
        loop = asyncio.get_running_loop()
        if self._free is None or self._loop is not loop:
            self._free, self._loop = asyncio.Queue(), loop
            for slot in self.slots:
                self._free.put_nowait(slot)
        return self._free

    def pieces(self, headers: list[ChunkHeader | None], layer: int, first: int, last: int, s: int) -> list[Piece]:
        """Runs of about ``piece_bytes`` decoded bytes of chunks first..last-1 of ``layer``."""
        per = max(1, self.piece_bytes // max(s, 1))
        out = []
        for a in range(first, last, per):
            b = min(a + per, last)
            enc_at, mid_at, enc, mid = [], [], 0, 0
            for j in range(a, b):
                h = headers[j]
                enc_at.append(-1 if h is None else enc)
                mid_at.append(mid if h is not None and h.codec.lossy else -1)
                if h is not None:
                    enc += h.lengths[layer]
                    if h.codec.lossy:
                        mid += h.codec.intermediate_size(h.dtype, h.layout)
            out.append(Piece(layer, a, b, first, enc_at, mid_at))
        return out

    async def decode(self, fds: list[int], offsets: list[int], headers: list[ChunkHeader | None], keys: list[str],
                     layer: int, first: int, last: int, s: int, dest: memoryview, checksum: bool) -> int:
        """Layer ``layer`` of chunks first..last-1 decoded into ``dest`` (chunk j at ``(j - first)·s``); its CRC32C
        (0 unless ``checksum``)."""
        pieces = self.pieces(headers, layer, first, last, s)
        # Its stages in one job while fewer layers decode than there are decompress threads (not crowding out staged pieces)
        whole = len(pieces) == 1 and self._decoding < self.workers["decompress"]
        self._decoding += 1
        try:
            work = [asyncio.ensure_future(self._piece(fds, offsets, headers, keys, p, s, dest, checksum, whole)) for p in pieces]
            try:
                results = await asyncio.gather(*work, return_exceptions=True)  # every piece done: none still writes
            except asyncio.CancelledError:  # the client left: the transport's buffer is freed only once no stage writes into it
                await _settled(asyncio.wait(work))
                raise
        finally:
            self._decoding -= 1
        for r in results:
            if isinstance(r, BaseException):
                raise r
        crc = 0
        if checksum:
            for p, piece_crc in zip(self.pieces(headers, layer, first, last, s), results):
                crc = crc32c_combine(crc, piece_crc, (p.b - p.a) * s)  # type: ignore[arg-type]
        return crc

    async def _piece(self, fds, offsets, headers, keys, p: Piece, s: int, dest: memoryview, checksum: bool, alone: bool = False) -> int:
        """One piece through the stages. ``alone`` (the only piece of its layer, fewer layers decoding than decompress
        threads): the three stages run one after another in one job (see :func:`_all_stages`)."""
        loop = asyncio.get_running_loop()
        free = self._queue()
        slot = await free.get()
        try:
            enc = sum(headers[j].lengths[p.layer] for j in range(p.a, p.b) if headers[j] is not None)
            mid = sum(headers[j].codec.intermediate_size(headers[j].dtype, headers[j].layout)
                      for j, at in zip(range(p.a, p.b), p.mid_at) if at >= 0)
            slot.ensure(enc, mid)
            n, m = (p.b - p.a) * s, self.meters
            if alone:
                return await _settled(loop.run_in_executor(self.decompress_pool, _all_stages, m, n, fds, offsets, headers, keys, p, s, dest,
                                                           slot, checksum))
            await _settled(loop.run_in_executor(self.fetch_pool, _timed, m["fetch"], n, _fetch, fds, offsets, headers, keys, p, s, dest, slot))
            await _settled(loop.run_in_executor(self.decompress_pool, _timed, m["decompress"], n, _decompress, headers, keys, p, s, dest, slot))
            return await _settled(loop.run_in_executor(self.dequantise_pool, _timed, m["dequantise"], n, _dequantise, headers, keys, p, s,
                                                       dest, slot, checksum))
        finally:
            free.put_nowait(slot)  # only once its stage's thread has returned: no late write into a slot another piece holds


def _all_stages(meters: dict[str, StageMeter], n: int, fds, offsets, headers, keys, p: Piece, s: int, dest: memoryview, slot: Slot,
                checksum: bool) -> int:
    """Fetch, decompress and dequantise one after another on one thread, each timed on its own meter. A piece with no
    other piece beside it has nothing to overlap its stages with, and each hop between the stage pools costs a thread's
    wake-up and the loop's: int4+zstd, 16 MiB over 32 layers of one piece each, the node's kv-get took 85-100 ms for
    42 ms of stage work (on this VM a wake-up of an idle core is 0.1-0.35 ms, six per piece)."""
    _timed(meters["fetch"], n, _fetch, fds, offsets, headers, keys, p, s, dest, slot)
    _timed(meters["decompress"], n, _decompress, headers, keys, p, s, dest, slot)
    return _timed(meters["dequantise"], n, _dequantise, headers, keys, p, s, dest, slot, checksum)


async def _settled(awaitable):
    """Await ``awaitable`` to its end even if this task is cancelled meanwhile (a stage's thread cannot be stopped:
    returning early would let the caller free or reuse memory it still writes); then re-raise the cancellation."""
    fut = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(fut)
        except asyncio.CancelledError:
            if fut.cancelled():
                raise
            cancelled = True
            continue
        if cancelled:
            raise asyncio.CancelledError
        return result


def _read(fd: int, view: memoryview, offset: int, what: str) -> None:
    n = os.preadv(fd, [view], offset)
    if n != len(view):
        raise S3Error(ErrorCode.InternalError, f"short read of {what}: {n} of {len(view)} bytes")


def _fetch(fds, offsets, headers, keys, p: Piece, s: int, dest: memoryview, slot: Slot) -> None:
    encoded = memoryview(slot.encoded)
    for i, j in enumerate(range(p.a, p.b)):
        h = headers[j]
        if h is None:
            at = (j - p.base) * s
            _read(fds[j], dest[at : at + s], offsets[j] + p.layer * s, f"chunk {keys[j]!r}")
        else:
            n = h.lengths[p.layer]
            _read(fds[j], encoded[p.enc_at[i] : p.enc_at[i] + n], offsets[j] + h.offsets[p.layer], f"chunk {keys[j]!r}")


def _decompress(headers, keys, p: Piece, s: int, dest: memoryview, slot: Slot) -> None:
    encoded = memoryview(slot.encoded)
    for i, j in enumerate(range(p.a, p.b)):
        h = headers[j]
        if h is None:
            continue
        blob = encoded[p.enc_at[i] : p.enc_at[i] + h.lengths[p.layer]]
        if crc32c(blob) != h.crcs[p.layer]:
            raise bad_chunk(keys[j], f"layers[{p.layer}].crc32c", "the encoded layer slice does not match its checksum")
        if p.mid_at[i] >= 0:
            out = slot.mid[p.mid_at[i] : p.mid_at[i] + h.codec.intermediate_size(h.dtype, h.layout)]
        else:
            at = (j - p.base) * s
            out = np.frombuffer(dest, np.uint8, s, at)
        try:
            h.codec.decompress(blob, h.dtype, h.layout, out)
        except CodecError as e:
            raise bad_chunk(keys[j], f"layers[{p.layer}].{e.field}", str(e)) from None


def _dequantise(headers, keys, p: Piece, s: int, dest: memoryview, slot: Slot, checksum: bool) -> int:
    """The lossy stage of the piece, one call per run of neighbouring chunks stored alike (their intermediates lie back
    to back in the slot, their slices in ``dest``): see ``Codec.dequantise``'s ``count``."""
    kinds = [None if h is None or at < 0 else (h.codec.id, h.dtype, h.layout) for h, at in zip(headers[p.a : p.b], p.mid_at)]
    for i, n in alike_runs(kinds):  # lossy chunks' intermediates are laid out one after another in the slot (pieces())
        h, j = headers[p.a + i], p.a + i
        size = h.codec.intermediate_size(h.dtype, h.layout)
        mid, out = slot.mid[p.mid_at[i] : p.mid_at[i] + n * size], np.frombuffer(dest, np.uint8, n * s, (j - p.base) * s)
        try:
            h.codec.dequantise(mid, h.dtype, h.layout, out, n)
        except CodecError as e:
            raise bad_chunk(keys[j + e.index], f"layers[{p.layer}].{e.field}", str(e)) from None
    start = (p.a - p.base) * s
    return crc32c(dest[start : start + (p.b - p.a) * s]) if checksum else 0

