"""The read pool's gathers of chunk slices into a destination. When every chunk is mapped in one arena
(:mod:`storage_server.store.mapped_files`), a run is one ``np.take`` of rows of the arena (no syscall and no Python per
slice); otherwise it is one ``preadv`` per chunk (chunkwise: one scatter ``preadv`` per chunk whose iovecs land its L
slices at their layer-major places). Each returns the CRC32C of what it just copied, while it is still in cache."""

from __future__ import annotations

import os

import numpy as np
from awscrt.checksums import crc32c

from protocol.errors import ErrorCode, S3Error

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024

# A warm, mapped piece this small is one memory copy of well under a millisecond: gathered on the event loop it
# costs less than handing it to the read threads and back. py-spy, shm G16x256 (1 MiB layers): the loop spent 23% of
# its time in run_in_executor's futures and GIL hand-offs while the read threads were 98% idle; inline, a whole
# 32 MiB kv-get took 13.9 ms instead of 24.0 (4 MiB layers: 34.8 vs 42.1 ms). Larger pieces still go to the threads,
# so no one transfer holds the loop for more than about half a millisecond at a time.
INLINE_GATHER_BYTES = 4 << 20


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


def _crc_layers(data: memoryview, layer_bytes: int, layers: int) -> list[int]:
    return [crc32c(data[i * layer_bytes : (i + 1) * layer_bytes]) for i in range(layers)]
