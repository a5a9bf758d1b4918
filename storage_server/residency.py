"""Whether a transfer's chunks are in the page cache, and a deep read-ahead when they are not.

Warm chunks are copied at memory speed, but a cold chunk is read from disk on first
touch — by the reading thread itself, one chunk at a time per thread, so only two
reads are in flight on a 2-core node while the disk wants a deep queue. Before the
first layer, one non-blocking 1-byte read (``RWF_NOWAIT``) of a few chunks spread over
the prefix samples the page-cache hit ratio (microseconds; no system call per chunk
when the chunks are warm). If any sampled chunk is cold, ``posix_fadvise(WILLNEED)``
asks the kernel to read every chunk whole, which queues the reads asynchronously (the
device's whole queue, not two), from a thread beside the layer reads. The read-ahead is
bounded by what memory can hold: half of ``MemAvailable`` (or of the cgroup's
``memory.max`` headroom, when that is smaller); chunks past it are read on demand.
"""

from __future__ import annotations

import os

SAMPLE = 8


def resident_fraction(fds: list[int], offsets: list[int], sample: int = SAMPLE) -> float:
    """Of up to ``sample`` chunks spread over the list, the fraction whose first byte is in the page cache."""
    if not fds or not hasattr(os, "RWF_NOWAIT"):
        return 1.0
    picks = sorted({len(fds) * i // sample for i in range(sample)})
    buf = bytearray(1)
    hits = 0
    for j in picks:
        try:
            hits += os.preadv(fds[j], [buf], offsets[j], os.RWF_NOWAIT) == 1
        except BlockingIOError:
            pass
        except OSError:
            return 1.0  # RWF_NOWAIT unsupported here: assume warm (reads work as before)
    return hits / len(picks)


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _cgroup_headroom() -> int | None:
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open("/sys/fs/cgroup/memory.current") as f:
            return max(0, int(limit) - int(f.read()))
    except (OSError, ValueError):
        return None


def read_ahead_budget() -> int:
    """Bytes of cold chunks worth reading ahead: half of what memory can take now."""
    room = [v for v in (_meminfo_available(), _cgroup_headroom()) if v is not None]
    return min(room) // 2 if room else 0


def read_ahead(fds: list[int], offsets: list[int], sizes: list[int], budget: int) -> int:
    """Ask the kernel to read chunks whole, in order, up to ``budget`` bytes; returns the bytes asked for."""
    asked = 0
    for fd, offset, size in zip(fds, offsets, sizes):
        if asked + size > budget:
            break
        try:
            os.posix_fadvise(fd, offset, size, os.POSIX_FADV_WILLNEED)
        except OSError:
            break  # advice only: the layer reads fetch what was not read ahead
        asked += size
    return asked
