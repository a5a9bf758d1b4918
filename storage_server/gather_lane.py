"""A second lane for a warm gather: a read thread copies the first part of every layer while the event loop copies the rest.

A warm layerwise kv-get into shared memory is memory copies and nothing else (the chunks are
mapped, the destination is the client's region), and one thread's copy is bounded by what one core
can move: measured here 9.2 GiB/s for 4 MiB layers of 64 KiB slices, against 13.3 GiB/s with two
threads each copying its half of every layer (1.45×). Mooncake Store's same-host read is one
memcpy, so on one host a single-threaded gather cannot be more than even with it.

The lane runs ahead on its own (no hand-off per layer, which cost as much as it saved: two
threads synchronised on every layer measured no faster than one); the loop gathers its part of
layer ℓ, then waits for the lane's part of ℓ only if the lane is behind, woken by the lane through
``call_soon_threadsafe`` (never a blocking wait on the loop). A layer is ready when both parts
are in place; its CRC32C is the lane's part combined with the loop's, in order.

The lane takes only a core nothing else wants: its thread runs under SCHED_IDLE (where the process
may undo that: root, or RLIMIT_NICE; else at normal priority), and it starts once the first
layer's frame is out. With the lane busy from the start, the kernel placed the
client, woken by that frame, behind the loop on the loop's core (both cores looked busy), and the
first layer was seen 2.2-3.4 ms after the request instead of 1.4-1.6 (G256x64); a nice-19 lane did
the same. Where other work keeps every core busy (an engine spinning on them), an idle-priority
lane would hardly run and the loop would wait on it: a lane the loop has waited on for
``LANE_PATIENCE_S`` is made a normal thread for the rest of that transfer. (A normal-priority lane
throughout: G256x64 15.2-15.8 ms against 13.9-14.6.) With 1 MiB layers the client, woken for every
frame, keeps taking the core back, and a lane lost (below).

Used only where it pays and takes nothing from others (:func:`lane_split`): a warm, mapped,
raw transfer, unpaced (a lane running ahead would outrun a pacer's schedule), with layers of
2-8 MiB (smaller: see above; larger: the loop's part would go to the read pool, which already
splits it into runs), and no other transfer gathering at the time (under concurrency the
transfers already keep the cores busy).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Executor

import numpy as np

from .decode_pipeline import _settled
from .gather import INLINE_GATHER_BYTES, _take_run
from .thread_priority import idle_priority, normal_priority, priority_reversible

# A layer at least this large gets a second lane. With 1 MiB layers the lane lost (G64x64 and G16x256: 7.2-7.8 ms against
# 4.9-5.6 alone, with or without the loop spinning for it instead of a wake-up): the client, woken for every frame, keeps
# taking the second core from the lane, which runs only where nothing else would. 2 MiB: 9.3-10.0 against 9.6-10.6 ms;
# 4 MiB (G256x64): 14.0-14.6 against 16.0-16.9; 8 MiB (G512x64): 23.5-24.4 against 26.6-29.1.
LANE_MIN_LAYER_BYTES = 2 << 20
LANE_PATIENCE_S = 0.002  # the loop waits this long for a lagging lane before raising its priority
REVERSIBLE = priority_reversible()  # else the lane runs at normal priority: idle, it could not be promoted if starved
# Of each layer's chunks, the lane copies this share, but at least what leaves the loop's part within one inline gather
# (INLINE_GATHER_BYTES: a larger part goes to the read pool, three threads on two cores). The lane runs where nothing
# else would, and the client woken for every frame takes its core for a moment: with an even split the loop waited on
# it. Interleaved runs of 60 cache-evicted kv-gets each, median ms: G128x64 (2 MiB layers) 9.5-9.8 at 0.35 against
# 10.3-11.3 at 0.5; G256x64 (4 MiB) 13.7-13.9 against 15.3-16.8 (0.3: 13.5-14.7, 0.4: 14.1-18.0, 0.6: 17.2-17.7);
# G512x64 (8 MiB) 24.6-28.9 at 0.5, 32.4-33.7 at 0.35 (its loop part over 4 MiB went to the pool): hence the bound.
LANE_SHARE = 0.35


def lane_split(num_chunks: int, layer_bytes: int, others_gathering: int, cores: int) -> int:
    """Chunks ``[0, split)`` of every layer for the lane (0: no lane): pure, so the rule reads in one place."""
    if cores < 2 or others_gathering or num_chunks < 2 or not LANE_MIN_LAYER_BYTES <= layer_bytes <= 2 * INLINE_GATHER_BYTES:
        return 0  # (a larger layer is already split into runs across the read pool)
    loop_at_most = INLINE_GATHER_BYTES * num_chunks // layer_bytes  # chunks the loop gathers inline in one piece
    return max(1, min(num_chunks - 1, max(int(num_chunks * LANE_SHARE), num_chunks - loop_at_most)))


class GatherLane:
    """Chunks ``[0, split)`` of each of ``layers``, gathered on a read thread into ``buffer_of(layer)``."""

    def __init__(self, pool: Executor, rows: np.ndarray, first_rows: np.ndarray, split: int, layers: range, size: int,
                 buffer_of: Callable[[int], memoryview], checksum: bool) -> None:
        self._loop = asyncio.get_running_loop()
        self._args = (rows, first_rows, split, size, checksum)
        self._layers, self._buffer_of = layers, buffer_of
        self._lock = threading.Lock()
        self._crcs: dict[int, int] = {}
        self._failed: BaseException | None = None
        self._ended = False
        self._waiter: tuple[int, asyncio.Future[None]] | None = None
        self._stop = False
        self._pool = pool
        self._tid = 0  # the lane thread's, once it runs
        self.promoted = False
        self._thread: asyncio.Future[None] | None = None

    def start(self) -> None:
        """Begin copying (once the first layer's frame is out)."""
        if self._thread is None:
            self._thread = self._loop.run_in_executor(self._pool, self._work)

    def _work(self) -> None:
        rows, first_rows, split, size, checksum = self._args
        with self._lock:  # (a promotion asked for before this thread ran, or while it starts, is not lost)
            self._tid = threading.get_native_id()
            if REVERSIBLE and not self.promoted:  # again: a transfer before may have promoted this thread
                idle_priority()
        try:
            for layer in self._layers:
                if self._stop:
                    return
                crc = _take_run(rows, first_rows, 0, split, 0, layer, size, self._buffer_of(layer), checksum)
                with self._lock:
                    self._crcs[layer] = crc
                    self._wake(layer)
        except BaseException as e:
            with self._lock:
                self._failed = e
        finally:
            with self._lock:
                self._ended = True
                self._wake(None)

    def _wake(self, layer: int | None) -> None:
        """Under the lock: let the loop's wait for ``layer`` go (None: the lane ended, every wait goes)."""
        if self._waiter is not None and (layer is None or self._waiter[0] <= layer):
            fut = self._waiter[1]
            self._waiter = None
            self._loop.call_soon_threadsafe(_set, fut)

    async def crc(self, layer: int) -> int:
        """Once the lane's part of ``layer`` is in place: its CRC32C (0 unless checksummed)."""
        self.start()
        while True:
            with self._lock:
                if layer in self._crcs:
                    return self._crcs.pop(layer)
                if self._failed is not None:
                    raise self._failed
                if self._ended:
                    raise RuntimeError(f"the gather lane stopped before layer {layer}")
                fut = self._loop.create_future()
                self._waiter = (layer, fut)
            # Starved (other work keeps every core busy: the lane at idle priority hardly runs): promoted to a normal
            # thread after LANE_PATIENCE_S, so the transfer never waits on idle cycles for long.
            promote = self._loop.call_later(LANE_PATIENCE_S, self._promote)
            try:
                await fut
            finally:
                promote.cancel()

    def _promote(self) -> None:
        with self._lock:
            self.promoted = True
            if self._tid:  # else not running yet (queued behind the transfer before): it starts at normal priority
                normal_priority(self._tid)

    async def close(self) -> None:
        """Stop after the layer being copied and wait for the thread: no copy into the destination after this returns."""
        self._stop = True
        if self._thread is not None:
            await _settled(self._thread)


def _set(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
