"""When the storage server's Python garbage collector may pause its event loop.

A full collection scans every live container object. This daemon keeps hundreds of
thousands of them (remembered chunk locations, LRU names, open-file entries, the
index's caches), so an automatic full collection is a 10+ ms pause wherever the
allocation counter happens to trip: measured, a 13.8 ms generation-2 pause between
two layer reads of a G=16 64K fetch (and ~1 ms generation-1 pauses), on the critical
path of the first layer. So: what is alive at start-up is frozen (never scanned
again), automatic collections stop at generation 1, and the full collection runs at
housekeeping time while no transfer is in flight (or, on a server never idle, at most
``max_deferrals`` rounds late), after which the survivors are frozen too. Memory is
still freed by reference counting at once; only cyclic garbage waits for that round.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

NEVER = 1 << 30  # a generation-2 threshold automatic collection does not reach


class GcSchedule:
    def __init__(self, busy: Callable[[], bool], max_deferrals: int = 6) -> None:
        self.busy = busy
        self.max_deferrals = max_deferrals
        self.deferred = 0
        self.collections = 0
        self._threshold: tuple[int, int, int] | None = None

    def start(self) -> None:
        """Freeze what start-up built; automatic collections from now on stop at generation 1."""
        gc.collect()
        gc.freeze()
        self._threshold = gc.get_threshold()
        gc.set_threshold(self._threshold[0], self._threshold[1], NEVER)

    def stop(self) -> None:
        """Back to the interpreter's own schedule (a daemon run inside another program, e.g. a test)."""
        if self._threshold is not None:
            gc.set_threshold(*self._threshold)
            self._threshold = None
            gc.unfreeze()

    def housekeeping(self) -> bool:
        """One round: a full collection if the server is idle (or was busy too long); whether it ran."""
        if self.busy() and self.deferred < self.max_deferrals:
            self.deferred += 1
            return False
        self.deferred = 0
        gc.collect()
        gc.freeze()  # the survivors are long-lived: the next rounds need not scan them again
        self.collections += 1
        return True
