"""Whether a transfer's chunks are in the page cache, and a deep read-ahead when they are not.

Warm chunks are copied at memory speed, but a cold chunk is read from disk on first
touch — by the reading thread itself, one chunk at a time per thread, so only two
reads are in flight on a 2-core node while the disk wants a deep queue. Before the
first layer, the page-cache state of a few chunks spread over the prefix samples the
hit ratio: ``cachestat(2)`` (Linux 6.5+) of each sampled chunk's first page, or
``mincore(2)`` of a one-page mapping where that call is missing — a few microseconds,
and neither reads anything. (A non-blocking ``RWF_NOWAIT`` 1-byte read, used before,
starts read-ahead of the very page it finds missing, so on a fast disk it raced its own
read-ahead and saw cold chunks warm.) If any sampled chunk is cold,
``posix_fadvise(WILLNEED)`` asks the kernel to read every chunk whole, which queues the
reads asynchronously (the device's whole queue, not two), from a thread beside the layer
reads. The read-ahead is bounded by what memory can hold: half of ``MemAvailable`` (or
of the cgroup's ``memory.max`` headroom, when that is smaller); chunks past it are read
on demand.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os

import numpy as np

SAMPLE = 8
PAGE = mmap.PAGESIZE
_SYS_CACHESTAT = 451  # one number on every architecture (the unified syscall table, Linux 6.5)


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in
                ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - a libc-less interpreter
    _libc = None
_cachestat_works = _libc is not None and hasattr(_libc, "syscall")


def _cachestat_cached(fd: int, offset: int) -> bool | None:
    """Whether the page holding ``offset`` is cached; None when the kernel has no cachestat."""
    global _cachestat_works
    if not _cachestat_works:
        return None
    rng, st = _Range(offset - offset % PAGE, 1), _Cachestat()
    if _libc.syscall(_SYS_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(st), 0) == 0:
        return st.nr_cache > 0
    if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):  # older kernel, or a seccomp filter refusing it
        _cachestat_works = False
    return None


def _mincore_cached(fd: int, offset: int) -> bool | None:
    """The same through ``mincore`` of a one-page mapping (mapping it faults nothing in)."""
    if _libc is None:
        return None
    try:
        m = mmap.mmap(fd, PAGE, prot=mmap.PROT_READ, offset=offset - offset % PAGE)
    except (OSError, ValueError):
        return None
    try:
        view = np.frombuffer(m, np.uint8)  # its address: ctypes wants a writable buffer, numpy does not
        vec = (ctypes.c_ubyte * 1)()
        ok = _libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(PAGE), vec) == 0
        del view
        return bool(vec[0] & 1) if ok else None
    finally:
        m.close()


def page_cached(fd: int, offset: int) -> bool:
    """Whether the page holding byte ``offset`` of ``fd`` is in the page cache (assumed so when unknowable)."""
    for probe in (_cachestat_cached, _mincore_cached):
        cached = probe(fd, offset)
        if cached is not None:
            return cached
    return True  # no way to tell: assume warm (reads work as before)


def resident_fraction(fds: list[int], offsets: list[int], sample: int = SAMPLE) -> float:
    """Of up to ``sample`` chunks spread over the list, the fraction whose first byte is in the page cache."""
    if not fds:
        return 1.0
    picks = sorted({len(fds) * i // sample for i in range(sample)})
    return sum(page_cached(fds[j], offsets[j]) for j in picks) / len(picks)


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
