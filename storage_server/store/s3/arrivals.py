"""Where chunks a second source (a peer) sends for one kv-get arrive: straight into memory the kv-get reads, not
through the cache's files first.

Store-and-forward (write each arriving chunk into a new cache file, then map the files and gather the layers) put a
file create, a page-cache write and a fresh mapping's page faults on the kv-get's path for every chunk: perf on the
receiving node of a 64 MB peer fetch had 45% of its CPU in the kernel, most of it ext4 inode creation and buffered
writes. Here each raw chunk is received into its row of one shared-memory file (a ``memfd``), the kv-get gathers
its layers from that mapping as it would from the cache's (one ``np.take`` per layer), and the chunks are written
into the cache beside it (:func:`land`, on a thread of the lowest priority): written through the cache, as fetched
chunks always are, but off the path to the engine. The memory lives until both the kv-get and the landing are done
with it; a chunk of another size (a compressed one) does not arrive here and takes the cache path.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from protocol.errors import ErrorCode, S3Error

from ..cache.chunk_files import ChunkFiles
from ..chunk_source import PinnedChunks

LAND_BATCH = 16  # arrived chunks written into the cache per trip to the landing thread


def _lowest_priority() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only (Linux)
    except (OSError, AttributeError):
        pass


# One thread writes arrived chunks into the cache, at nice 19: on a busy host the kv-gets' own work runs first.
_LANDER = ThreadPoolExecutor(1, thread_name_prefix="objectcache-land", initializer=_lowest_priority)
_LANDINGS: set[asyncio.Task] = set()


@dataclass(frozen=True)
class Owed:
    """An arrived chunk this pin claimed, to be written into the cache: its row, chunk id, upstream version, parent."""

    row: int
    cid: str
    version: str
    parent: str | None


@dataclass
class Arrivals:
    """``count`` rows of ``row_bytes`` in one memfd, for the chunks of one pin (row ``i``: the ``i``-th wanted chunk).
    ``landed[i]`` is the upstream version of row ``i``'s checked chunk once it has fully arrived (absent: not arrived)."""

    count: int
    row_bytes: int
    fd: int = -1
    landed: dict[int, str] = field(default_factory=dict)
    _map: mmap.mmap | None = None
    _array: np.ndarray | None = None
    _holders: int = 1  # the pin that made it; the kv-get and the landing each take one more

    @classmethod
    def make(cls, count: int, row_bytes: int) -> "Arrivals":
        a = cls(count, row_bytes)
        a.fd, a._map = _POOL.take(max(1, count * row_bytes))
        a._array = np.frombuffer(a._map, np.uint8, count * row_bytes)
        return a

    def row(self, i: int, size: int) -> memoryview | None:
        """Where the ``i``-th wanted chunk is received, if it has this arena's size (else None: it takes the cache path)."""
        if size != self.row_bytes or not 0 <= i < self.count or self._array is None:
            return None
        return self.view(i)

    def holds(self, i: int, data: object) -> bool:
        """Whether ``data`` is row ``i`` of this arena (a chunk received here, not in a buffer of its own)."""
        if not isinstance(data, memoryview) or self._array is None:
            return False
        base = self._array.ctypes.data + i * self.row_bytes
        return len(data) == self.row_bytes and np.frombuffer(data, np.uint8).ctypes.data == base

    def rows(self, row_bytes: int) -> np.ndarray:
        """The whole arena as rows of ``row_bytes`` (a divisor of the chunk size): what the executor gathers from."""
        assert self._array is not None and self.row_bytes % row_bytes == 0
        return self._array.reshape(-1, row_bytes)

    def view(self, i: int) -> memoryview:
        assert self._array is not None
        return memoryview(self._array[i * self.row_bytes : (i + 1) * self.row_bytes])  # type: ignore[arg-type]

    def hold(self) -> None:
        self._holders += 1

    def let_go(self) -> None:
        """One holder is done; the last one frees the memory."""
        self._holders -= 1
        if self._holders == 0:
            fd, m = self.fd, self._map
            self._array, self._map, self.fd = None, None, -1
            assert m is not None
            _POOL.give(fd, m)


class MemfdPool:
    """A few idle arrival buffers kept for the next kv-get: a fresh memfd's pages fault in on first touch (a
    64 MB prefix: 16K faults, 15% of the receiving node's CPU under perf). Thread-safe; at most ``keep`` idle, none
    larger than ``max_bytes``, and a buffer is reused only for a kv-get needing at least half of it."""

    def __init__(self, keep: int = 2, max_bytes: int = 256 << 20) -> None:
        self.keep, self.max_bytes = keep, max_bytes
        self._idle: list[tuple[int, mmap.mmap]] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> tuple[int, mmap.mmap]:
        with self._lock:
            for k, (fd, m) in enumerate(self._idle):
                if nbytes <= len(m) <= 2 * nbytes:
                    return self._idle.pop(k)
        fd = os.memfd_create("objectcache-arrivals", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, nbytes)
            return fd, mmap.mmap(fd, nbytes)
        except BaseException:
            os.close(fd)
            raise

    def give(self, fd: int, m: mmap.mmap) -> None:
        """An idle buffer: kept for reuse, or freed (the mapping goes with its last reference)."""
        with self._lock:
            if len(self._idle) < self.keep and len(m) <= self.max_bytes:
                self._idle.append((fd, m))
                return
        os.close(fd)


_POOL = MemfdPool()


class Landing(Protocol):
    """What landing arrived chunks needs of the chunk cache (:class:`~storage_server.store.s3.chunks.S3ChunkSource`)."""

    files: ChunkFiles
    arrived_cached: int

    def release(self, cid: str) -> None: ...

    def stale(self, cid: str) -> bool: ...


def copy_rows(fds: list[int], rows: list[memoryview]) -> None:
    """Whole cached chunk files into rows of a kv-get's arrivals."""
    for fd, row in zip(fds, rows):
        if os.preadv(fd, [row], 0) != len(row):
            raise S3Error(ErrorCode.InternalError, "a cached chunk file is shorter than its name says")


def _write_rows(files: list[tuple[Path, memoryview]]) -> None:
    for path, data in files:
        with open(path, "wb") as f:
            f.write(data)


async def pinned_with_arrivals(cache: Landing, arrivals: Arrivals, owed: list[Owed], tenant: str, on_disk: list[int],
                               fds: list[int], mapped: list, disk_sizes: list[int], release_files: Callable[[], None]) -> PinnedChunks:
    """A pin some of whose chunks arrived in memory. When every chunk is raw, the cached ones are copied in beside them
    (one memory copy each, in a worker thread) so the executor gathers every layer from the one mapping; otherwise each
    chunk is read where it is. ``owed`` (the arrived chunks this pin claimed) are written into the cache beside the
    kv-get, by a thread of the lowest CPU priority (the kv-get's delivery goes first), and their claims released as
    each is cached: another kv-get of the same prefix waits for that, not for this kv-get's delivery."""
    loop = asyncio.get_running_loop()
    n = arrivals.count
    arrivals.hold()  # the landing's hold, from now: it writes beside the kv-get, at a low priority
    task = loop.create_task(land(cache, arrivals, owed, tenant))
    _LANDINGS.add(task)  # the loop keeps only a weak reference to a task
    task.add_done_callback(_LANDINGS.discard)

    def done() -> None:
        release_files()
        arrivals.let_go()

    if all(size == arrivals.row_bytes for size in disk_sizes):
        try:
            await loop.run_in_executor(None, copy_rows, fds, [arrivals.view(j) for j in on_disk])
        except BaseException:  # no pin is handed out: its hold and files go now (the landing keeps its own)
            done()
            raise
        result = PinnedChunks([arrivals.fd] * n, [j * arrivals.row_bytes for j in range(n)], [arrivals.row_bytes] * n, [None] * n, done)
        result.derived["row_source"] = arrivals  # read_plan gathers every layer from this mapping
        return result
    col = {j: (fds[k], 0, disk_sizes[k], mapped[k]) for k, j in enumerate(on_disk)}
    rows = [col.get(j, (arrivals.fd, j * arrivals.row_bytes, arrivals.row_bytes, None)) for j in range(n)]
    return PinnedChunks([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows], done)


async def land(cache: Landing, arrivals: Arrivals, owed: list[Owed], tenant: str) -> None:
    """Write chunks a kv-get received in memory into the cache, as fetched chunks always are, ``LAND_BATCH`` files per
    worker-thread trip; a chunk deleted or overwritten through this node meanwhile is not written. Each claim is
    released once its chunk is cached (or is not going to be)."""
    loop = asyncio.get_running_loop()
    files, size = cache.files, arrivals.row_bytes
    try:
        for k in range(0, len(owed), LAND_BATCH):
            kept = [(o, files.new_tmp()) for o in owed[k : k + LAND_BATCH] if not cache.stale(o.cid) and files.reserve(size, tenant)]
            try:
                await loop.run_in_executor(_LANDER, _write_rows, [(tmp, arrivals.view(o.row)) for o, tmp in kept])
            except BaseException:
                for _, tmp in kept:
                    files.unreserve(size)
                    tmp.unlink(missing_ok=True)
                raise
            for o, tmp in kept:
                if cache.stale(o.cid):  # dropped while it was written
                    files.unreserve(size)
                    tmp.unlink(missing_ok=True)
                else:
                    files.commit(o.cid, tmp, size, o.version, o.parent, tenant)
                    cache.arrived_cached += 1
                cache.release(o.cid)
    finally:
        for o in owed:
            cache.release(o.cid)
        arrivals.let_go()
