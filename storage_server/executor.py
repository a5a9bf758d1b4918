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

Its parts: :mod:`.read_plan` (what is read), :mod:`.gather` (the read pool's gathers), :mod:`.direct_runs`
(a cold transfer split between the page cache and O_DIRECT); this module schedules the reads and deliveries.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from protocol.checksums import crc32c_combine
from protocol.errors import S3Error
from protocol.wire import Mode, TransferStats

from .compressed_reads import read_encoded
from .decode_choice import wire_layer_bytes
from .decode_pipeline import DecodePipeline, _settled
from .direct_reads import DirectFiles
from .direct_runs import DirectRuns
from .gather import INLINE_GATHER_BYTES, IOV_MAX, _crc_layers, _read_run, _read_whole_chunks, _take_run, _take_whole_chunks
from .gather_lane import GatherLane, lane_split
from .memory_budget import MemoryBudget
from .read_path import READ_AHEAD_WINDOW_BYTES, ReadPath, plan_read_path, wanted_bytes
from .read_plan import ReadPlan, _stats, one_run_keeps_ahead
from .residency import resident_fraction
from .transports import Transport

__all__ = ["COLD_FRACTION", "INLINE_GATHER_BYTES", "IOV_MAX", "Executor", "Pacer", "ReadPlan"]

# Layers of chunks the node decodes into shared memory that decode at once (this one and the next): one layer at a
# time left all decode threads but one idle where a layer is one piece (see _notify_decoded).
DECODE_AHEAD_LAYERS = 2
COLD_FRACTION = 0.5  # at most this share of the sampled chunks in the page cache: the transfer reads past it


class Pacer(Protocol):
    """Paces layer reads (the bandwidth pool's lease, or whatever a test injects)."""

    async def before_layer(self, nbytes: int) -> None: ...

    def after_layer(self) -> None: ...


class Executor(DirectRuns):
    """Runs plans on a bounded read pool shared by all transfers of this server."""

    def __init__(self, io_threads: int, direct_depth: int = 0, read_path: str = "direct", budget: MemoryBudget | None = None, *,
                 decompress_threads: int = 2, dequantise_threads: int = 2, piece_bytes: int = 1 << 20,
                 read_ahead_window_bytes: int = READ_AHEAD_WINDOW_BYTES) -> None:
        self.pool = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="kv-read")
        self.io_threads = io_threads
        self.direct_depth = direct_depth  # O_DIRECT reads in flight for cold transfers; 0: always through the page cache
        self.read_path = read_path  # storage_server.read_path: how cold transfers split page cache and O_DIRECT
        self.budget = budget or MemoryBudget()  # the page cache every transfer of this server shares
        self.read_ahead_window_bytes = read_ahead_window_bytes  # page-cache layers asked ahead of the one being read (0: all at once)
        self._direct: ThreadPoolExecutor | None = None
        # Compressed chunks: fetch on the read pool, then decompress and dequantise on pools of their own.
        self.decoder = DecodePipeline(self.pool, io_threads, decompress_threads, dequantise_threads, piece_bytes)
        self.gathering = 0  # layerwise shm transfers in their gather loop (a second lane only for one alone)
        self.lanes = 0  # transfers gathered with a second lane (:mod:`.gather_lane`)
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self._lane: ThreadPoolExecutor | None = None  # the gather lane's thread, at idle priority (spare cores only)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        if self._lane is not None:
            self._lane.shutdown(wait=True)
        self.decoder.close()
        if self._direct is not None:
            self._direct.shutdown(wait=True)

    def _runs(self, first: int, last: int, copies: bool = False) -> list[tuple[int, int]]:
        """``[first, last)`` in contiguous runs, one per read thread; warm mapped chunks (``copies``: memory copies that
        nothing blocks, unlike reads that may wait on the disk) in no more runs than cores: G16x3584's 14 MiB layer in 16
        runs on 2 cores took 1.6-2.2 ms a layer, in 2 runs 1.35-1.45."""
        n = last - first
        k = max(1, min(self.io_threads, n, self.cores if copies else n))
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
        copies = plan.mapped and plan.warm
        runs = self._runs(first, last, copies) if plan.spread or not copies else [(first, last)]
        futures = [loop.run_in_executor(self.pool, fn, *sources, a, b, *args) for a, b in runs]
        try:
            return [(b - a, result) for (a, b), result in zip(runs, await _settled(asyncio.gather(*futures)))]
        except BaseException:
            await _settled(asyncio.gather(*futures, return_exceptions=True))
            raise

    async def read_piece(self, plan: ReadPlan, layer: int, first: int, last: int, dest: memoryview, checksum: bool = False,
                         yield_first: bool = True) -> int:
        """Slice ``layer`` of chunks first..last-1, in prefix order, into ``dest``; returns the piece's
        CRC32C (0 unless ``checksum``), each run's taken by its reader and the runs' combined in order.
        ``yield_first=False``: a piece gathered on the loop is gathered without a loop turn first."""
        s = plan.descriptor.per_layer_chunk_bytes
        if plan.headers is not None:
            return await self.decoder.decode(plan.fds, plan.offsets, plan.headers, plan.descriptor.chunk_keys, layer, first, last, s,
                                             dest, checksum)
        if plan.mapped and plan.warm and (last - first) * s <= INLINE_GATHER_BYTES:
            if yield_first:
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
        # Asked only where it can change the path (a transfer mostly cold): its alignment check walks every chunk's
        # offset (0.3-0.5 ms of a 3,584-chunk kv-get's time before layer 0 on the loaded machine).
        direct_possible = resident <= COLD_FRACTION and self._direct_possible(plan, transport)
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
        elif transport.notify_only:
            return await self._run_notify(plan, transport, pacer, started, layers)
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

    async def _run_notify(self, plan: ReadPlan, transport: Transport, pacer: Pacer | None, started: float, layers: range) -> TransferStats:
        """Layerwise into a ``notify_only`` transport (shm: the pieces land in the client's memory, a layer's delivery is
        one LAYER frame): each layer's frame is written as soon as its last piece is read, in the loop that reads — no
        delivery task per piece. py-spy, shm G64x64 (1 MiB layers gathered on the event loop): the delivery tasks, each
        awaiting the one before and a ``wait_for`` task per frame, ran one step per loop turn between gathers, so layer
        ℓ's frame left several gathers after its read (layer 8 read by 3.8 ms, its frame sent at 10.5 ms) and the client
        received the layers in a burst at the end. A frame waits only where the client is a socket buffer behind.

        Pieces gathered on the loop give other work a turn once INLINE_GATHER_BYTES were gathered since the last (the
        loop is held no longer than for one such piece), not before every piece: there is no delivery task to let go
        first, and a turn before every 1 MiB layer was 32 trips through the selector per G64x64 kv-get."""
        d = plan.descriptor
        split = 0
        if pacer is None and plan.mapped and plan.warm and plan.headers is None:
            split = lane_split(len(plan.fds), d.layer_bytes, self.gathering, self.cores)
        timeline = [[0.0, 0.0, 0.0] for _ in range(d.num_layers)]
        lane = None
        self.gathering += 1
        try:
            if split:
                if self._lane is None:
                    self._lane = ThreadPoolExecutor(1, thread_name_prefix="kv-gather-lane")  # its priority: gather_lane
                self.lanes += 1
                # The first layer is the loop's alone, and the lane starts once its frame is out: the client then wakes on
                # the idle core at once (with the lane already busy, the kernel queued the woken client behind the
                # loop: first layer 2.2-3.4 ms instead of 1.4-1.6 at G256x64).
                lane = GatherLane(self._lane, plan.rows, plan.first_rows, split, layers[1:], d.per_layer_chunk_bytes,  # type: ignore[arg-type]
                                  lambda layer: transport.piece_buffer(layer, 0, split), d.layer_checksums)
            if plan.headers is not None and pacer is None:
                read_s, deliver_s = await self._notify_decoded(plan, transport, started, layers, timeline)
            else:
                read_s = await self._notify_layers(plan, transport, pacer, started, layers, timeline, lane, split)
                deliver_s = sum(r[2] - r[1] for r in timeline)
        finally:
            try:
                if lane is not None:
                    await lane.close()  # before another transfer may take the lane's thread
            finally:
                self.gathering -= 1
        first_layer_s = timeline[layers[0]][2] if layers and layers[0] == 0 else 0.0
        return _stats(plan, timeline, read_s, deliver_s, started, first_layer_s)

    async def _notify_layers(self, plan: ReadPlan, transport: Transport, pacer: Pacer | None, started: float, layers: range,
                             timeline: list[list[float]], lane: GatherLane | None, split: int) -> float:
        """:meth:`_run_notify`'s loop over the layers (the loop's pieces; the lane's part of each joined before its frame)."""
        d = plan.descriptor
        n, k = len(plan.fds), plan.piece_chunks
        whole = [(a, min(a + k, n)) for a in range(0, n, k)]
        after_lane = [(a, min(a + k, n)) for a in range(split, n, k)]
        read_s = 0.0
        frames = transport.frames
        unyielded = 0  # bytes gathered on the loop since it last gave other work a turn
        for layer in layers:
            if pacer is not None:
                await pacer.before_layer(d.layer_bytes)  # refused (a load budget): the layers before it are out already
            t0 = time.perf_counter()
            timeline[layer][0] = t0 - started
            crc = 0
            laned = lane is not None and layer != layers[0]
            try:
                for first, last in (after_lane if laned else whole):
                    unyielded += (last - first) * d.per_layer_chunk_bytes
                    yield_first = unyielded > INLINE_GATHER_BYTES
                    if yield_first:
                        unyielded = (last - first) * d.per_layer_chunk_bytes
                    piece_crc = await self.read_piece(plan, layer, first, last, transport.piece_buffer(layer, first, last), d.layer_checksums,
                                                      yield_first)
                    crc = crc32c_combine(crc, piece_crc, (last - first) * d.per_layer_chunk_bytes) if d.layer_checksums else 0
                if laned:  # the layer's leading chunks: the lane's CRC comes first
                    lane_crc = await lane.crc(layer)  # type: ignore[union-attr]
                    crc = crc32c_combine(lane_crc, crc, (n - split) * d.per_layer_chunk_bytes) if d.layer_checksums else 0
            finally:
                if pacer is not None:
                    pacer.after_layer()
            t1 = time.perf_counter()
            read_s += t1 - t0
            timeline[layer][1] = t1 - started
            if layer == layers[0] and plan.mapped and plan.warm and one_run_keeps_ahead(t1 - t0, self.cores, d.compute_window):
                plan.spread = False  # the later layers on one thread: the engine computes longer than that takes
            if not transport.layer_ready_now(layer, crc):
                await transport.layer_ready(layer, crc)
            elif frames.queued():
                await frames.flushed()  # the client is a socket buffer behind: no reading ahead of it (and its stall bound)
            timeline[layer][2] = time.perf_counter() - started
            if lane is not None:
                lane.start()  # from the second layer on
        return read_s

    async def _notify_decoded(self, plan: ReadPlan, transport: Transport, started: float, layers: range,
                              timeline: list[list[float]]) -> tuple[float, float]:
        """:meth:`_notify_layers` for chunks the node decodes, unpaced: the next DECODE_AHEAD_LAYERS - 1 layers decode
        while this one does (each layer's place in the client's memory is its own), the LAYER frames still in order.
        One layer at a time, a layer of one piece kept one decode thread busy and the others idle. Nothing still
        decodes into the client's memory once this returns, whatever ended it. Returns the read time (the reads' union)
        and the delivery time (a layer's from its read's end, or the frame before it where that went later)."""
        d = plan.descriptor
        n, k, s = len(plan.fds), plan.piece_chunks, d.per_layer_chunk_bytes

        async def read(layer: int) -> int:
            timeline[layer][0] = time.perf_counter() - started
            crc = 0
            for first, last in ((a, min(a + k, n)) for a in range(0, n, k)):
                piece_crc = await self.read_piece(plan, layer, first, last, transport.piece_buffer(layer, first, last), d.layer_checksums)
                crc = crc32c_combine(crc, piece_crc, (last - first) * s) if d.layer_checksums else 0
            timeline[layer][1] = time.perf_counter() - started
            return crc

        ahead: list[asyncio.Future] = []
        current: asyncio.Future | None = None
        todo = iter(layers)
        read_s = deliver_s = covered = last_frame = 0.0
        try:
            for layer in layers:
                while len(ahead) < DECODE_AHEAD_LAYERS and (nxt := next(todo, None)) is not None:
                    ahead.append(asyncio.ensure_future(read(nxt)))
                current = ahead.pop(0)
                crc = await current
                current = None
                read_s += max(0.0, timeline[layer][1] - max(timeline[layer][0], covered))  # the reads' union, not their sum
                covered = max(covered, timeline[layer][1])
                if not transport.layer_ready_now(layer, crc):
                    await transport.layer_ready(layer, crc)
                elif transport.frames.queued():
                    await transport.frames.flushed()  # the client is a socket buffer behind: no reading ahead of it
                now = time.perf_counter() - started
                deliver_s += now - max(timeline[layer][1], last_frame)  # a layer decoded ahead waited for that frame
                timeline[layer][2] = last_frame = now
        finally:
            rest = ahead + ([current] if current is not None else [])
            for task in rest:
                task.cancel()
            if rest:  # a decode cancelled mid-layer returns only once its stage threads have (DecodePipeline.decode)
                await _settled(asyncio.gather(*rest, return_exceptions=True))
        return read_s, deliver_s
