"""A cold layerwise transfer split along its read path (:mod:`storage_server.read_path`): the first layers through
the page cache, read ahead a window at a time as the transfer consumes them (:mod:`.read_ahead`), the rest with O_DIRECT a group of layers at a
time, ``direct_depth`` reads in flight; afterwards the chunks warmed into the page cache within the shared budget."""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from awscrt.checksums import crc32c

from protocol.wire import Mode, TransferStats

from .decode_pipeline import _settled
from .direct_reads import DirectFiles, aligned, group_layers, read_layer_group, read_pool
from .memory_budget import MemoryBudget
from .read_ahead import WindowedReadAhead
from .read_path import ReadPath, read_ahead_window
from .read_plan import ReadPlan, _stats
from .residency import read_ahead
from .transports import Transport

if TYPE_CHECKING:
    from .executor import Pacer


class DirectRuns:
    """The :class:`Executor`'s page-cache/O_DIRECT split of a transfer (its ``_run`` reads the page-cache layers)."""

    pool: ThreadPoolExecutor
    direct_depth: int
    read_path: str
    read_ahead_window_bytes: int
    budget: MemoryBudget
    _direct: ThreadPoolExecutor | None

    async def _run_path(self, plan: ReadPlan, transport: Transport, pacer: Pacer | None, started: float, path: ReadPath,
                        files: DirectFiles | None) -> TransferStats:
        """Layers 0..n₁−1 through the page cache (read ahead in a window that moves with the layer being read, layer 0
        alone first: :mod:`.read_ahead`), the rest with O_DIRECT."""
        d = plan.descriptor
        n1, s = path.page_cache_layers, d.per_layer_chunk_bytes
        cached = direct = None
        # The direct layers start once the page-cache layers are read: started beside them, their reads would
        # queue against the first layers' read-ahead, and the first layer is what an engine waits for.
        try:
            if n1:
                if not path.read_ahead_bytes:
                    cached = await self._run(plan, transport, pacer, started, range(n1))
                else:
                    window = read_ahead_window(d.layer_bytes, n1, self.read_ahead_window_bytes, plan.mode == Mode.LAYERWISE)
                    ahead = WindowedReadAhead(plan, n1, window, path.read_ahead_bytes, group_layers(s, d.num_layers), pacer)
                    ahead.start()
                    try:
                        cached = await self._run(plan, transport, ahead, started, range(n1))
                    finally:
                        read_ahead_bytes = await ahead.settle()  # the pinned fds stay open until every advice is done
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
