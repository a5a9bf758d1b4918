"""The descriptor executor: range reads of chunk objects, layer-major assembly, in-order delivery.

Layerwise, for ℓ = 0..L-1: the slice ``[ℓS, (ℓ+1)S)`` of every chunk is copied
straight into the layer's destination (chunk j at ``j·S``) by a bounded thread
pool, each task a contiguous run of chunks with the GIL released. When every
chunk is mapped in one arena (:mod:`storage_server.store.mapped_files`), a run is
one ``np.take`` of rows of the arena (no syscall and no Python per slice);
otherwise it is one ``preadv`` per chunk;
the layer's CRC32C (unless the descriptor waives it) is computed by each reader
over the run it has just copied (still in cache) and the runs' CRCs combined in
order; the delivery of layer ℓ overlaps the reads of layer ℓ+1; layers are
delivered strictly in order.

Chunkwise, each chunk object is read whole by one scatter ``preadv`` whose
iovecs land its L slices at their layer-major places (mapped chunks: one
``np.take`` per layer); all notifications come at the end.

Compressed chunks (``ReadPlan.headers``) are read and decoded by the staged
:mod:`storage_server.decode_pipeline` into the same places, or, for a client
that decodes (``Descriptor.client_decodes``), sent as stored in ENCODED frames.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from awscrt.checksums import crc32c

from protocol.checksums import crc32c_combine
from protocol.errors import ErrorCode, S3Error
from protocol.wire import Descriptor, Mode, TransferStats

from .compressed_reads import ChunkHeader, read_encoded
from .decode_choice import wire_layer_bytes
from .decode_pipeline import DecodePipeline, _settled
from .direct_reads import DirectFiles, aligned, group_layers, read_layer_group, read_pool
from .memory_budget import MemoryBudget
from .read_path import ReadPath, plan_read_path, wanted_bytes
from .residency import read_ahead, resident_fraction
from .store import PinnedChunks
from .transports import Transport

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
COLD_FRACTION = 0.5  # at most this share of the sampled chunks in the page cache: the transfer reads past it


class Pacer(Protocol):
    """Paces layer reads (the bandwidth pool's lease, or whatever a test injects)."""

    async def before_layer(self, nbytes: int) -> None: ...

    def after_layer(self) -> None: ...


# A warm, mapped piece this small is one memory copy of well under a millisecond: gathered on the event loop it
# costs less than handing it to the read threads and back. py-spy, shm G16x256 (1 MiB layers): the loop spent 23% of
# its time in run_in_executor's futures and GIL hand-offs while the read threads were 98% idle; inline, a whole
# 32 MiB kv-get took 13.9 ms instead of 24.0 (4 MiB layers: 34.8 vs 42.1 ms). Larger pieces still go to the threads,
# so no one transfer holds the loop for more than about half a millisecond at a time.
INLINE_GATHER_BYTES = 4 << 20

@dataclass
class ReadPlan:
    """What the executor reads: the descriptor, the mode chosen, and the pinned chunks' files in prefix order."""

    descriptor: Descriptor
    mode: Mode
    fds: list[int]
    offsets: list[int]  # where each chunk starts in its file
    piece_chunks: int  # layerwise: chunks read (and delivered) at a time
    rows: np.ndarray | None = None  # every chunk mapped: the arena as rows of S bytes ...
    first_rows: np.ndarray | None = None  # ... and each chunk's layer-0 row in it
    # Some chunk is compressed: each chunk's header (None: raw). Its layer slices are not S bytes at
    # ℓ·S, so such a plan takes neither the mapped gather nor O_DIRECT groups: the decode pipeline reads them.
    headers: list[ChunkHeader | None] | None = None
    # Slices go as stored in ENCODED frames, the client decodes (CLIENT_DECODES, or DECODE_AUTO's choice).
    send_encoded: bool = False
    # Every sampled chunk was in the page cache: a mapped piece up to INLINE_GATHER_BYTES is gathered on the loop.
    warm: bool = False

    @classmethod
    def of(cls, descriptor: Descriptor, mode: Mode, pinned: PinnedChunks, piece_chunks: int,
           headers: list[ChunkHeader | None] | None = None) -> "ReadPlan":
        if headers is not None or descriptor.client_decodes:
            return cls(descriptor, mode, pinned.fds, pinned.offsets, piece_chunks, headers=headers, send_encoded=descriptor.client_decodes)
        s = descriptor.per_layer_chunk_bytes
        known = pinned.derived.get(("rows", s))  # the same pins as a transfer before (a resolved prefix)
        rows, first_rows = known if known is not None else pinned.derived.setdefault(("rows", s), _mapped_rows(pinned, s))
        return cls(descriptor, mode, pinned.fds, pinned.offsets, piece_chunks, rows, first_rows)

    @property
    def mapped(self) -> bool:
        return self.rows is not None


def _mapped_rows(pinned: PinnedChunks, size: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The arena's rows of ``size`` bytes and each chunk's first row, if every chunk is mapped whole in one arena."""
    first = pinned.mapped[0] if pinned.mapped and size > 0 else None
    if first is None or (rows := first.arena.rows(size)) is None or any(pinned.offsets):
        return None, None
    arena = first.arena
    try:
        slots = [m.index for m in pinned.mapped if m.arena is arena]  # type: ignore[union-attr]
    except AttributeError:  # one is not mapped
        return None, None
    if len(slots) != len(pinned.mapped):
        return None, None
    return rows, np.asarray(slots, np.intp) * (arena.slot_bytes // size)


def _take_run(rows: np.ndarray, first_rows: np.ndarray, first: int, last: int, base: int, layer: int, size: int, dest: memoryview,
              checksum: bool = False) -> int:
    """Row ``layer`` of mapped chunks first..last-1 into ``dest`` at ``(j - base)·size``: one gather, GIL released.
    Returns the CRC32C of the bytes gathered (0 unless ``checksum``), computed while they are still in cache."""
    start, nbytes = (first - base) * size, (last - first) * size
    out = np.frombuffer(dest, np.uint8, nbytes, start).reshape(-1, size)
    np.take(rows, first_rows[first:last] + layer, axis=0, out=out, mode="clip")  # "clip": no checked copy of out
    return crc32c(dest[start : start + nbytes]) if checksum else 0


def _take_whole_chunks(rows: np.ndarray, first_rows: np.ndarray, first: int, last: int, n_chunks: int, layers: int, size: int, dest: memoryview) -> None:
    """Mapped chunks first..last-1, every layer, into layer-major places."""
    for layer in range(layers):
        _take_run(rows, first_rows, first, last, -layer * n_chunks, layer, size, dest)  # chunk j at (layer·n + j)·size


def _read_run(fds: list[int], offsets: list[int], first: int, last: int, base: int, file_offset: int, size: int, dest: memoryview,
              checksum: bool = False) -> int:
    """Read ``[file_offset, +size)`` of chunks first..last-1 into ``dest`` at ``(j - base)·size`` (prefix order);
    returns the CRC32C of the run (0 unless ``checksum``)."""
    pos = start = (first - base) * size
    for j in range(first, last):
        n = os.preadv(fds[j], [dest[pos : pos + size]], offsets[j] + file_offset)
        if n != size:
            raise S3Error(ErrorCode.InternalError, f"short read of chunk #{j}: {n} of {size} bytes")
        pos += size
    return crc32c(dest[start:pos]) if checksum else 0


def _read_whole_chunks(fds: list[int], offsets: list[int], first: int, last: int, n_chunks: int, layers: int, size: int, dest: memoryview) -> None:
    """Scatter-read whole chunk objects into layer-major places."""
    stride = n_chunks * size
    for j in range(first, last):
        iov = [dest[layer * stride + j * size : layer * stride + (j + 1) * size] for layer in range(layers)]
        for k in range(0, layers, IOV_MAX):
            part = iov[k : k + IOV_MAX]
            if os.preadv(fds[j], part, offsets[j] + k * size) != size * len(part):
                raise S3Error(ErrorCode.InternalError, f"short read of chunk #{j}")


def _stats(plan: ReadPlan, timeline: list[list[float]], read_s: float, deliver_s: float, started: float, first_layer_s: float) -> TransferStats:
    """The END frame's report of a transfer that started at ``started``."""
    return TransferStats(
        layer_timeline=[[round(t, 6) for t in times] for times in timeline],
        mode=plan.mode.name.lower(),
        payload_bytes=plan.descriptor.payload_bytes,
        storage_read_s=read_s,
        delivery_s=deliver_s,
        total_s=time.perf_counter() - started,
        first_layer_s=first_layer_s,
    )


def _layer_order(plan: ReadPlan, layers: int, group: int) -> tuple[list[int], list[int], list[int]]:
    """Read-ahead ranges of layers 0..layers-1 in the order the transfer consumes them: a group of layers of every
    chunk, then the next group (chunk by chunk, the first layer would wait for the last chunk's every layer)."""
    s = plan.descriptor.per_layer_chunk_bytes
    fds, offsets, sizes = [], [], []
    for first in range(0, layers, group):
        n = min(group, layers - first) * s
        for fd, offset in zip(plan.fds, plan.offsets):
            fds.append(fd)
            offsets.append(offset + first * s)
            sizes.append(n)
    return fds, offsets, sizes


def _crc_layers(data: memoryview, layer_bytes: int, layers: int) -> list[int]:
    return [crc32c(data[i * layer_bytes : (i + 1) * layer_bytes]) for i in range(layers)]


class Executor:
    """Runs plans on a bounded read pool shared by all transfers of this server."""

    def __init__(self, io_threads: int, direct_depth: int = 0, read_path: str = "direct", budget: MemoryBudget | None = None, *,
                 decompress_threads: int = 2, dequantise_threads: int = 2, piece_bytes: int = 1 << 20) -> None:
        self.pool = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="kv-read")
        self.io_threads = io_threads
        self.direct_depth = direct_depth  # O_DIRECT reads in flight for cold transfers; 0: always through the page cache
        self.read_path = read_path  # storage_server.read_path: how cold transfers split page cache and O_DIRECT
        self.budget = budget or MemoryBudget()  # the page cache every transfer of this server shares
        self._direct: ThreadPoolExecutor | None = None
        # Compressed chunks: fetch on the read pool, then decompress and dequantise on pools of their own.
        self.decoder = DecodePipeline(self.pool, io_threads, decompress_threads, dequantise_threads, piece_bytes)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.decoder.close()
        if self._direct is not None:
            self._direct.shutdown(wait=True)

    def _runs(self, first: int, last: int) -> list[tuple[int, int]]:
        n = last - first
        k = max(1, min(self.io_threads, n))
        bounds = [first + n * i // k for i in range(k + 1)]
        return [(bounds[i], bounds[i + 1]) for i in range(k) if bounds[i] < bounds[i + 1]]

    async def _read_runs(self, fn, plan: ReadPlan, first: int, last: int, *args) -> list[tuple[int, int]]:
        """Run ``fn(fds, offsets, a, b, *args)`` (mapped plans: ``fn(rows, first_rows, a, b, *args)``)
        over contiguous runs ``[a, b)`` of chunks first..last-1 on the read pool; returns each run's
        length in chunks with what ``fn`` returned for it, in order.

        If one run fails, or the transfer is cancelled, the others are waited for before the error propagates,
        so no thread is still writing into a buffer the caller is about to free (a cancellation cancels only
        the futures that wrap the threads: without ``_settled`` the wait below returned at once).
        """
        loop = asyncio.get_running_loop()
        sources = (plan.rows, plan.first_rows) if plan.mapped else (plan.fds, plan.offsets)
        runs = self._runs(first, last)
        futures = [loop.run_in_executor(self.pool, fn, *sources, a, b, *args) for a, b in runs]
        try:
            return [(b - a, result) for (a, b), result in zip(runs, await _settled(asyncio.gather(*futures)))]
        except BaseException:
            await _settled(asyncio.gather(*futures, return_exceptions=True))
            raise

    async def read_piece(self, plan: ReadPlan, layer: int, first: int, last: int, dest: memoryview, checksum: bool = False) -> int:
        """Slice ``layer`` of chunks first..last-1, in prefix order, into ``dest``; returns the piece's
        CRC32C (0 unless ``checksum``), each run's taken by its reader and the runs' combined in order."""
        s = plan.descriptor.per_layer_chunk_bytes
        if plan.headers is not None:
            return await self.decoder.decode(plan.fds, plan.offsets, plan.headers, plan.descriptor.chunk_keys, layer, first, last, s,
                                             dest, checksum)
        if plan.mapped and plan.warm and (last - first) * s <= INLINE_GATHER_BYTES:
            await asyncio.sleep(0)  # the pieces before this one go out first (their deliveries are tasks)
            return _take_run(plan.rows, plan.first_rows, first, last, first, layer, s, dest, checksum)  # type: ignore[arg-type]
        if plan.mapped:
            runs = await self._read_runs(_take_run, plan, first, last, first, layer, s, dest, checksum)
        else:
            runs = await self._read_runs(_read_run, plan, first, last, first, layer * s, s, dest, checksum)
        crc = 0
        if checksum:
            for chunks, run_crc in runs:
                crc = crc32c_combine(crc, run_crc, chunks * s)
        return crc

    async def run(self, plan: ReadPlan, transport: Transport, pacer: Pacer | None = None) -> TransferStats:
        """Execute ``plan`` into ``transport``; returns statistics for the END frame.

        Layerwise, each layer is read in pieces of ``plan.piece_chunks`` chunks
        (one piece per layer when the destination is the client's memory; bounded
        pieces when the transport stages bytes in this server). A piece's delivery
        (its CRC, its bytes over ``http``) overlaps the reads of the next piece,
        pieces and layers are delivered strictly in order, and a staging buffer is
        reused only once the piece in it was delivered.
        ``pacer.before_layer(nbytes)`` is awaited before each layer is read and
        ``pacer.after_layer()`` called once it is read (layerwise only).
        """
        d = plan.descriptor
        started = time.perf_counter()
        if plan.send_encoded:  # http: slices as stored, the client decodes
            return await self._run_encoded(plan, transport, pacer, started)
        if plan.headers is not None:  # compressed chunks: the decode pipeline (no O_DIRECT groups, no L·S read-ahead)
            return await self._run(plan, transport, pacer, started, range(d.num_layers))
        resident = resident_fraction(plan.fds, plan.offsets)
        plan.warm = resident == 1.0
        layer_bytes = len(plan.fds) * d.per_layer_chunk_bytes
        direct_possible = self._direct_possible(plan, transport)
        with self.budget.holding(wanted_bytes(self.read_path, d.num_layers, layer_bytes, resident, COLD_FRACTION, direct_possible)) as grant:
            path = plan_read_path(self.read_path, num_layers=d.num_layers, layer_bytes=layer_bytes, resident=resident,
                                  cold_fraction=COLD_FRACTION, granted=grant[0], direct_possible=direct_possible)
            self.budget.give_back(grant[0] - path.read_ahead_bytes)  # what the plan does not use is free for others now
            grant[0] = path.read_ahead_bytes
            files = DirectFiles.open(plan.fds) if path.direct else None
            if path.direct and files is None:  # this filesystem refuses O_DIRECT (tmpfs): all through the page cache
                path = ReadPath(d.num_layers, False, path.read_ahead_bytes)
            stats = await self._run_path(plan, transport, pacer, started, path, files)
        stats.resident_sample = resident
        return stats

    async def _run_encoded(self, plan: ReadPlan, transport: Transport, pacer: Pacer | None, started: float) -> TransferStats:
        """Layer by layer, pieces of ``plan.piece_chunks`` chunks: each chunk's slice read as stored and sent as an
        ENCODED frame, then the layer's LAYER frame (checksum 0: each ENCODED frame carries its own)."""
        d = plan.descriptor
        loop = asyncio.get_running_loop()
        n, k, s = len(plan.fds), max(1, plan.piece_chunks), d.per_layer_chunk_bytes
        headers = plan.headers or [None] * n
        timeline = [[0.0, 0.0, 0.0] for _ in range(d.num_layers)]
        read_s = deliver_s = 0.0
        for layer in range(d.num_layers):
            if pacer is not None:  # the link carries the slices as stored: charge those bytes, not the raw layer's
                await pacer.before_layer(wire_layer_bytes(headers, layer, s))
            t0 = time.perf_counter()
            timeline[layer][0] = t0 - started
            try:
                for first in range(0, n, k):
                    t = time.perf_counter()
                    slices = await loop.run_in_executor(self.pool, read_encoded, plan.fds, plan.offsets, headers, d.chunk_keys, layer,
                                                        first, min(first + k, n), s)
                    read_s += time.perf_counter() - t
                    t = time.perf_counter()
                    for j, (payload, crc) in enumerate(slices, first):
                        await transport.deliver_encoded(layer, j, payload, crc)
                    deliver_s += time.perf_counter() - t
            finally:
                if pacer is not None:
                    pacer.after_layer()
            timeline[layer][1] = time.perf_counter() - started
            await transport.layer_ready(layer, 0)
            timeline[layer][2] = time.perf_counter() - started
        return _stats(plan, timeline, read_s, deliver_s, started, timeline[0][2] if timeline else 0.0)

    async def _run_path(self, plan: ReadPlan, transport: Transport, pacer: Pacer | None, started: float, path: ReadPath,
                        files: DirectFiles | None) -> TransferStats:
        """Layers 0..n₁−1 through the page cache (their bytes read ahead, deep-queued), the rest with O_DIRECT."""
        d = plan.descriptor
        loop = asyncio.get_running_loop()
        n1, s = path.page_cache_layers, d.per_layer_chunk_bytes
        cached = direct = None
        # The direct layers start once the page-cache layers are read: started beside them, their reads would
        # queue against the first layers' read-ahead, and the first layer is what an engine waits for.
        try:
            if n1:
                ahead = None if not path.read_ahead_bytes else loop.run_in_executor(
                    None, read_ahead, *_layer_order(plan, n1, group_layers(s, d.num_layers)), path.read_ahead_bytes)
                try:
                    cached = await self._run(plan, transport, pacer, started, range(n1))
                finally:
                    read_ahead_bytes = await ahead if ahead is not None else 0  # the pinned fds stay open until it is done
                cached.read_ahead_bytes = read_ahead_bytes
            if files is not None and n1 < d.num_layers:
                direct = await self._run_direct(plan, transport, pacer, started, files, range(n1, d.num_layers))
            if direct is not None:
                direct.direct_read_bytes = (d.num_layers - n1) * len(plan.fds) * s
                if self.read_path == "direct":
                    # Kept for reuse (a prefix is fetched again): the kernel reads the chunks into the page cache
                    # in the background, within the free budget, now that the transfer no longer waits on the disk.
                    direct.read_ahead_bytes = self._warm_later(plan)
        finally:
            if files is not None:
                files.close()
        if cached is None or direct is None:
            return cached or direct  # type: ignore[return-value]
        cached.layer_timeline[n1:] = direct.layer_timeline[n1:]
        cached.storage_read_s += direct.storage_read_s
        cached.delivery_s += direct.delivery_s
        cached.total_s = direct.total_s
        cached.direct_read_bytes = direct.direct_read_bytes
        return cached

    def _direct_possible(self, plan: ReadPlan, transport: Transport) -> bool:
        """Whether this transfer could read past the page cache: layerwise into the client's own memory
        (``transport.reads_into_destination``) or page-aligned staging of whole layers (``aligned_staging``), every
        address aligned, a direct read pool configured."""
        d = plan.descriptor
        if not self.direct_depth or plan.mode != Mode.LAYERWISE:
            return False
        if not transport.reads_into_destination and not (transport.aligned_staging and plan.piece_chunks >= len(plan.fds)):
            return False  # staging: only page-aligned buffers, a whole layer per piece
        return aligned(d.per_layer_chunk_bytes, plan.offsets, [transport.piece_buffer(0, 0, len(plan.fds))])

    def _warm_later(self, plan: ReadPlan) -> int:
        """Read a cold transfer's chunks into the page cache in the background, within budget; the bytes asked for."""
        d = plan.descriptor
        size = d.num_layers * d.per_layer_chunk_bytes
        budget = self.budget.free() // 2  # half of what the running transfers leave: the next one needs room too
        count = min(len(plan.fds), budget // size if size else 0)
        if not count:
            return 0
        fds = [os.dup(fd) for fd in plan.fds[:count]]  # the transfer's pins end now; these end with the read-ahead

        def warm() -> None:
            try:
                read_ahead(fds, plan.offsets[:count], [size] * count, budget)
            finally:
                for fd in fds:
                    os.close(fd)

        self._direct_pool().submit(warm)  # fadvise may block on a full device queue: not on a layer reader
        return count * size

    async def _run_direct(self, plan: ReadPlan, transport: Transport, pacer: Pacer | None, started: float, files: DirectFiles,
                          layers_to_read: range) -> TransferStats:
        """Layerwise, ``layers_to_read`` a group of layers at a time: each chunk's layers of the group in one O_DIRECT read,
        ``direct_depth`` in flight."""
        d = plan.descriptor
        loop = asyncio.get_running_loop()
        n, s = len(plan.fds), d.per_layer_chunk_bytes
        # Rotating staging buffers (http) hold one layer each: a group is one layer, two in use at a time.
        group = 1 if transport.buffers_in_rotation else group_layers(s, d.num_layers)
        tasks = max(1, min(n, self.direct_depth * 4))  # more runs than threads: the queue stays full to the end
        runs = [(n * i // tasks, n * (i + 1) // tasks) for i in range(tasks)]
        timeline = [[0.0, 0.0, 0.0] for _ in range(d.num_layers)]
        read_s = deliver_s = 0.0
        pool = self._direct_pool()
        # Unpaced, one group is submitted ahead of the one being finished, so the device queue never
        # drains between groups; paced, a group is one paced unit of its bytes (the lease holds one slot).
        ahead = 0 if pacer is not None else 1
        in_flight: list[tuple[range, list[memoryview], list[asyncio.Future], float]] = []
        submitted: list[asyncio.Future] = []

        async def finish() -> None:
            nonlocal read_s, deliver_s
            layers, dests, futures, t0 = in_flight.pop(0)
            try:
                await _settled(asyncio.gather(*futures))  # a cancel must not cancel the wrappers of reads still running
            finally:
                if pacer is not None:
                    pacer.after_layer()
            t1 = time.perf_counter()
            read_s = t1 - started - timeline[layers_to_read.start][0]  # reads overlap: their span
            for layer, dest in zip(layers, dests):
                crc = await loop.run_in_executor(self.pool, crc32c, dest) if d.layer_checksums else 0
                t = time.perf_counter()
                await transport.deliver_piece(layer, 0, dest)
                await transport.layer_ready(layer, crc)
                deliver_s += time.perf_counter() - t
                timeline[layer] = [t0 - started, t1 - started, time.perf_counter() - started]

        try:
            for first_layer in range(layers_to_read.start, layers_to_read.stop, group):
                layers = range(first_layer, min(first_layer + group, layers_to_read.stop))
                dests = [transport.piece_buffer(layer, 0, n) for layer in layers]
                if pacer is not None:
                    await pacer.before_layer(d.layer_bytes * len(layers))
                t0 = time.perf_counter()
                if first_layer == layers_to_read.start:
                    timeline[first_layer][0] = t0 - started
                futures = [loop.run_in_executor(pool, read_layer_group, files, plan.offsets, a, b, first_layer, s, dests) for a, b in runs if a < b]
                submitted += futures
                in_flight.append((layers, dests, futures, t0))
                if len(in_flight) > ahead:
                    await finish()
            while in_flight:
                await finish()
        except BaseException:
            await _settled(asyncio.gather(*submitted, return_exceptions=True))  # no read is still writing when this returns
            raise
        return _stats(plan, timeline, read_s, deliver_s, started, timeline[layers_to_read.start][2] if layers_to_read else 0.0)

    def _direct_pool(self) -> ThreadPoolExecutor:
        if self._direct is None:
            self._direct = read_pool(self.direct_depth)
        return self._direct

    async def _run(self, plan: ReadPlan, transport: Transport, pacer: Pacer | None, started: float, layers: range) -> TransferStats:
        """Through the page cache: chunkwise every layer, layerwise ``layers`` (the first of them up to a prefix of all)."""
        d = plan.descriptor
        loop = asyncio.get_running_loop()
        read_s = deliver_s = first_layer_s = 0.0
        timeline: list[list[float]] = []  # layerwise: per layer read start, read end, ready
        if plan.mode == Mode.CHUNKWISE:
            dest = transport.payload_buffer()
            t0 = time.perf_counter()
            n = len(plan.fds)
            if plan.headers is not None:
                for layer in range(d.num_layers):
                    await self.read_piece(plan, layer, 0, n, dest[layer * d.layer_bytes : (layer + 1) * d.layer_bytes])
            else:
                whole = _take_whole_chunks if plan.mapped else _read_whole_chunks
                await self._read_runs(whole, plan, 0, n, n, d.num_layers, d.per_layer_chunk_bytes, dest)
            crcs = (await loop.run_in_executor(self.pool, _crc_layers, dest, d.layer_bytes, d.num_layers)
                    if d.layer_checksums else [0] * d.num_layers)
            t1 = time.perf_counter()
            await transport.deliver_payload(dest, crcs)
            read_s, deliver_s = t1 - t0, time.perf_counter() - t1
            first_layer_s = time.perf_counter() - started  # every layer is ready at once
        else:
            deliveries: list[asyncio.Task] = []  # one per piece, in order
            timeline = [[0.0, 0.0, 0.0] for _ in range(d.num_layers)]
            deliver_time = [0.0]
            crc = [0]  # running CRC32C of the layer being delivered
            first_ready = [0.0]

            async def deliver(layer: int, first: int, data: memoryview, piece_crc: int, ends_layer: bool, previous: asyncio.Task | None) -> None:
                if previous is not None:
                    await previous  # strict order (and the layer's CRC joins the pieces' in order)
                if d.layer_checksums:
                    crc[0] = crc32c_combine(crc[0], piece_crc, len(data))
                t = time.perf_counter()
                await transport.deliver_piece(layer, first, data)
                if ends_layer:
                    await transport.layer_ready(layer, crc[0])
                    crc[0] = 0
                    timeline[layer][2] = time.perf_counter() - started
                    if layer == 0:
                        first_ready[0] = timeline[layer][2]
                deliver_time[0] += time.perf_counter() - t

            n, k = len(plan.fds), plan.piece_chunks
            pieces = [(a, min(a + k, n)) for a in range(0, n, k)]
            reuse = transport.buffers_in_rotation
            try:
                for layer in layers:
                    if reuse and len(deliveries) >= reuse:
                        await deliveries[-reuse]  # the layer's first buffer is free (not waited for while holding a dispatch slot)
                    if pacer is not None:
                        try:
                            await pacer.before_layer(d.layer_bytes)
                        except S3Error:
                            if deliveries:  # a refused layer (a load budget): the layers before it still go out
                                await deliveries[-1]
                            raise
                    t0 = time.perf_counter()
                    timeline[layer][0] = t0 - started
                    try:
                        for first, last in pieces:
                            if reuse and len(deliveries) >= reuse:
                                await deliveries[-reuse]  # that buffer is free again
                            dest = transport.piece_buffer(layer, first, last)
                            piece_crc = await self.read_piece(plan, layer, first, last, dest, d.layer_checksums)
                            previous = deliveries[-1] if deliveries else None
                            if previous is not None and previous.done():
                                previous.result()  # a failed delivery (client gone) stops the reads now
                            deliveries.append(asyncio.ensure_future(deliver(layer, first, dest, piece_crc, last == n, previous)))
                    finally:
                        if pacer is not None:
                            pacer.after_layer()
                    t1 = time.perf_counter()
                    read_s += t1 - t0
                    timeline[layer][1] = t1 - started
                await deliveries[-1]
            except BaseException:
                for t in deliveries:
                    t.cancel()
                await asyncio.gather(*deliveries, return_exceptions=True)
                raise
            deliver_s, first_layer_s = deliver_time[0], first_ready[0]
        return _stats(plan, timeline, read_s, deliver_s, started, first_layer_s)
