"""Cold transfers read past the page cache: aligned ``O_DIRECT`` reads of several layers per chunk, many in flight.

A cold layer-major fetch touches a small slice of every chunk file per layer; through
the page cache each slice is a fault or a short read by one of two reader threads, so
two requests are in flight where a disk wants a deep queue (measured: 37% of the
disk's own ``O_DIRECT`` limit, with the kernel's read-ahead). Dual-Blade's answer is a
direct path for data that is not in memory: here a transfer whose sampled chunks are
mostly cold reads a *group* of consecutive layers of each chunk — one contiguous range
of its file, at least ``GROUP_BYTES`` — with one ``preadv`` whose iovecs are the
layers' places in the destination, ``depth`` chunks at a time on a pool of its own
(blocking reads are the queue). Layers are ready group by group, in order.

Only where every address is aligned (slices and destination to ``ALIGN``, the
destination the client's memory, as over ``shm``); elsewhere, or on a filesystem that
refuses ``O_DIRECT`` (tmpfs), the transfer reads through the page cache as before.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from protocol.errors import ErrorCode, S3Error

ALIGN = 4096  # O_DIRECT: offsets, lengths and memory aligned to the logical block (4 KiB covers 512 B too)
GROUP_BYTES = 256 << 10  # bytes of one chunk read by one request: layers are grouped up to this
DIRECT = getattr(os, "O_DIRECT", 0)


def group_layers(per_layer_chunk_bytes: int, num_layers: int) -> int:
    """Consecutive layers read together: one request of at least GROUP_BYTES per chunk (all layers at most)."""
    return max(1, min(num_layers, GROUP_BYTES // max(1, per_layer_chunk_bytes)))


def aligned(size: int, offsets: list[int], views: list[memoryview]) -> bool:
    """Whether slices of ``size`` bytes at these file offsets can be read straight into ``views`` with O_DIRECT."""
    if not DIRECT or size % ALIGN or any(o % ALIGN for o in offsets):
        return False
    return all(np.frombuffer(v, np.uint8).ctypes.data % ALIGN == 0 for v in views if len(v))


class DirectFiles:
    """``O_DIRECT`` descriptors of a transfer's chunk files, opened afresh from its pinned fds by the reader that
    first needs each (the opens overlap the reads instead of delaying the first), closed once."""

    def __init__(self, pinned: list[int]) -> None:
        self.pinned = pinned
        self.fds: list[int | None] = [None] * len(pinned)

    @classmethod
    def open(cls, pinned: list[int]) -> "DirectFiles | None":
        """The transfer's direct files, or None where this filesystem refuses O_DIRECT (tmpfs); the first is
        opened now, as the probe, the others by the readers."""
        try:
            first = _reopen(pinned[0])
        except (OSError, IndexError):
            return None
        files = cls(pinned)
        files.fds[0] = first
        return files

    def fd(self, j: int) -> int:
        """Chunk ``j``'s O_DIRECT descriptor (each index is one reader's: no two threads open the same)."""
        fd = self.fds[j]
        if fd is None:
            fd = self.fds[j] = _reopen(self.pinned[j])
        return fd

    def close(self) -> None:
        fds, self.fds = self.fds, [None] * len(self.pinned)
        for fd in fds:
            if fd is not None:
                os.close(fd)


def _reopen(fd: int) -> int:
    """The same open file, read past the page cache; the pinned fd is left as it is."""
    return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC | DIRECT)


def read_layer_group(files: DirectFiles, offsets: list[int], first: int, last: int, layer: int, size: int, dests: list[memoryview]) -> None:
    """Layers ``layer..layer+len(dests)-1`` of chunks first..last-1: one read per chunk, each layer's slice at ``j·size`` of its view."""
    want = size * len(dests)
    for j in range(first, last):
        start = j * size
        n = os.preadv(files.fd(j), [d[start : start + size] for d in dests], offsets[j] + layer * size)
        if n != want:
            raise S3Error(ErrorCode.InternalError, f"short direct read of chunk #{j}: {n} of {want} bytes")


def read_pool(depth: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=depth, thread_name_prefix="kv-direct")
