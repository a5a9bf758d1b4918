"""Read-only mappings of chunk files in fixed-size slots of reserved address ranges.

A layer of a G=16 prefix is one 16 KiB slice from each of thousands of chunk
files; one ``preadv`` per slice costs ~4.5 µs of syscall and Python overhead,
as long as the copy itself. Mapping every cached chunk file at a slot of one
reserved range (an :class:`Arena` per slot size) makes the whole range one
numpy array of rows, so a layer is gathered by a single ``np.take`` of row
indices: Python work per layer, not per slice, and no syscall per slice.

Safety: a mapping is read past the end of its file only by a bug — the slot maps
exactly the file's length (checked with ``fstat`` against the size the caller
expects) and chunk files are immutable: written under a temporary name, renamed,
later only unlinked, never truncated or rewritten in place, so a mapped page
never loses its backing (an unlinked file lives while it is mapped). Slots are
unmapped only when their owner (the open-file cache) closes an idle entry; a
slot a transfer holds is never unmapped. Unmapping replaces the slot with an
inaccessible reservation, so the range stays ours. Every mapping is one kernel
VMA (two with the gap beside it), so the number mapped at once is bounded well
below ``vm.max_map_count``; past the bound (or for a size no slot fits) a chunk
is simply not mapped and the executor reads it with ``preadv`` as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import threading
from dataclasses import dataclass

import numpy as np

PAGE = mmap.PAGESIZE
_PROT_NONE, _PROT_READ = 0, 1
_MAP_SHARED, _MAP_PRIVATE, _MAP_FIXED, _MAP_ANONYMOUS, _MAP_NORESERVE = 0x01, 0x02, 0x10, 0x20, 0x4000
_MAP_FAILED = ctypes.c_void_p(-1).value
ARENA_BYTES = 1 << 40  # address space reserved per slot size (1 TiB of 128: nothing is committed)
MAX_ARENAS = 8  # distinct chunk sizes mapped at once; others are read with preadv
VMAS_KEPT_FREE = 16384  # of vm.max_map_count, left to the allocator, libraries and regions


def _libc() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        return lib
    except (OSError, AttributeError):
        return None


_LIBC = _libc() if os.name == "posix" else None


def _max_map_count() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65530


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class Arena:
    """One reserved range of equal slots; slot ``i`` is ``[base + i·slot_bytes, +slot_bytes)``."""

    def __init__(self, slot_bytes: int, slots: int) -> None:
        assert _LIBC is not None
        self.slot_bytes, self.slots = slot_bytes, slots
        self.length = slot_bytes * slots
        base = _LIBC.mmap(None, self.length, _PROT_NONE, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
        if base in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), "cannot reserve address space for chunk mappings")
        self.base: int = base
        self.free = list(range(slots - 1, -1, -1))
        self._bytes = np.ctypeslib.as_array((ctypes.c_uint8 * self.length).from_address(base))
        self._rows: dict[int, np.ndarray] = {}

    def map(self, index: int, fd: int, size: int) -> bool:
        """Map ``size`` bytes of ``fd`` read-only at slot ``index``; False if the kernel refuses (e.g. too many mappings)."""
        addr = self.base + index * self.slot_bytes
        got = _LIBC.mmap(addr, _round_up(size, PAGE), _PROT_READ, _MAP_SHARED | _MAP_FIXED, fd, 0)  # type: ignore[union-attr]
        if got != addr:
            self.unmap(index)  # a failed MAP_FIXED may have left the slot unmapped: make it a reservation again
            return False
        return True

    def unmap(self, index: int) -> None:
        """Give slot ``index``'s file back; the slot becomes an inaccessible reservation again."""
        addr = self.base + index * self.slot_bytes
        got = _LIBC.mmap(addr, self.slot_bytes, _PROT_NONE, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE | _MAP_FIXED, -1, 0)  # type: ignore[union-attr]
        if got != addr:
            raise OSError(ctypes.get_errno(), "cannot unmap a chunk mapping")

    def rows(self, row_bytes: int) -> np.ndarray | None:
        """The whole range as rows of ``row_bytes`` (slot i's row r is row ``i·slot_bytes/row_bytes + r``), or None if rows straddle slots."""
        if self.slot_bytes % row_bytes:
            return None
        view = self._rows.get(row_bytes)
        if view is None:
            view = self._rows[row_bytes] = self._bytes.reshape(-1, row_bytes)
        return view

    def release(self) -> None:
        self._rows.clear()
        _LIBC.munmap(self.base, self.length)  # type: ignore[union-attr]


@dataclass(frozen=True)
class MappedSlot:
    """Where a mapped chunk file's bytes are: slot ``index`` of ``arena``."""

    arena: Arena
    index: int


class MappedFiles:
    """Arenas by slot size, with at most ``max_mapped`` files mapped at once. Thread-safe."""

    def __init__(self, max_mapped: int) -> None:
        self.max_mapped = min(max_mapped, max(0, (_max_map_count() - VMAS_KEPT_FREE) // 2)) if _LIBC is not None else 0
        self.arenas: dict[int, Arena] = {}
        self.mapped = 0
        self._lock = threading.Lock()

    def map(self, fd: int, size: int) -> MappedSlot | None:
        """Map an immutable file of ``size`` bytes; None (read it with preadv) if it cannot be mapped."""
        if size <= 0 or self.max_mapped == 0 or os.fstat(fd).st_size != size:
            return None
        slot_bytes = _round_up(size, PAGE)
        with self._lock:
            if self.mapped >= self.max_mapped:
                return None
            arena = self.arenas.get(slot_bytes)
            if arena is None:
                if len(self.arenas) >= MAX_ARENAS:
                    return None
                try:
                    arena = self.arenas[slot_bytes] = Arena(slot_bytes, max(1, min(ARENA_BYTES // slot_bytes, self.max_mapped)))
                except OSError:
                    return None
            if not arena.free:
                return None
            index = arena.free.pop()
            self.mapped += 1
        if arena.map(index, fd, size):
            return MappedSlot(arena, index)
        self._give_back(arena, index)
        return None

    def unmap(self, slot: MappedSlot) -> None:
        slot.arena.unmap(slot.index)
        self._give_back(slot.arena, slot.index)

    def _give_back(self, arena: Arena, index: int) -> None:
        with self._lock:
            arena.free.append(index)
            self.mapped -= 1

    def status(self) -> dict[str, int]:
        with self._lock:
            return {"mapped": self.mapped, "max_mapped": self.max_mapped, "arenas": len(self.arenas)}

    def close(self) -> None:
        """Release every arena (every slot must have been unmapped, or its reader be gone)."""
        with self._lock:
            arenas, self.arenas = list(self.arenas.values()), {}
            self.mapped = 0
        for a in arenas:
            a.release()
