"""One page-cache budget shared by every concurrent transfer of this node (Dual-Blade's B_pc, eq. 1–2).

Each cold transfer asks for the page cache its page-cache layers will fill; the budget
gives what is left of B_pc after the grants other running transfers hold, so two
concurrent cold transfers split it instead of each planning for half of MemAvailable.
A grant is given back when its transfer ends (its pages stay cached, and the next
reading of the memory facts counts them as the kernel does). Facts are re-read at most
every ``refresh_s`` (a read of /proc and the cgroup files per grant otherwise).
Single-threaded: grants are taken and given back on the event loop.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from .read_path import MemoryFacts, page_cache_budget, read_memory_facts


class MemoryBudget:
    def __init__(self, facts: Callable[[], MemoryFacts] = read_memory_facts, reserved: int = 0, refresh_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic, max_bytes: int = 0) -> None:
        self._facts, self.reserved, self.refresh_s, self._clock = facts, reserved, refresh_s, clock
        self.max_bytes = max_bytes  # storage_server.page_cache_max_bytes (0: no cap)
        self._read_at = float("-inf")
        self._total = 0
        self.held = 0
        self.grants = 0

    def total(self) -> int:
        """B_pc now (the facts re-read when older than ``refresh_s``)."""
        now = self._clock()
        if now - self._read_at >= self.refresh_s:
            total = page_cache_budget(self._facts(), self.reserved)
            self._total, self._read_at = min(total, self.max_bytes) if self.max_bytes else total, now
        return self._total

    def free(self) -> int:
        return max(0, self.total() - self.held)

    def take(self, want: int) -> int:
        """Up to ``want`` bytes of what is free, held until ``give_back``. A warm transfer wants none and reads no facts
        (re-reading /proc and the cgroup files was 0.7 ms before layer 0 of a kv-get more than ``refresh_s`` after the last)."""
        if want <= 0:
            return 0
        got = min(want, self.free())
        self.held += got
        self.grants += got > 0
        return got

    def give_back(self, n: int) -> None:
        self.held -= n

    @contextlib.contextmanager
    def holding(self, want: int) -> Iterator[list[int]]:
        """``[granted]`` for the block; the transfer may lower it (what its plan does not use goes back at once)."""
        grant = [self.take(want)]
        try:
            yield grant
        finally:
            self.give_back(grant[0])

    def status(self) -> dict[str, int]:
        return {"page_cache_budget_bytes": self._total, "held_bytes": self.held, "grants": self.grants}
