"""File descriptors for transfers, bounded by the process's file limit whatever a descriptor names.

A kv-get pins one open file per distinct chunk (and a cold one into the
client's memory opens an ``O_DIRECT`` twin of each), all at once, for its
whole run: a descriptor of 65,536 distinct chunks needs up to twice that many
descriptors. Past the process's
limit the opens fail with EMFILE half-way, the request ends in a 500, and
every other request that needs a descriptor meanwhile (a socket, a put) fails
too. So transfers take their descriptors from a budget of half the current
file limit: they wait until theirs fit beside the others', and one that could
never fit is refused up front with ``KVTooManyKeys`` naming the limit. The
daemon raises its soft limit to the hard one at start, so the budget is as
large as the operator allows (the systemd unit sets ``LimitNOFILE=1048576``).
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections.abc import AsyncIterator, Callable

from protocol.errors import ErrorCode, S3Error

FDS_PER_FILE = 2  # the pinned descriptor, and its O_DIRECT twin when the transfer may read cold chunks direct


def soft_fd_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def raise_fd_limit() -> int:
    """Raise the soft file limit to the hard one (what a daemon that holds many files should run with); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


class FdBudget:
    """Half the current file limit (read per request: an operator may change it under a running process)."""

    def __init__(self, limit: Callable[[], int] = soft_fd_limit) -> None:
        self._limit = limit
        self.held = 0
        self.waiting = 0
        self._changed = asyncio.Condition()

    @property
    def total(self) -> int:
        return max(FDS_PER_FILE, self._limit() // 2)

    def need(self, files: int, per_file: int = FDS_PER_FILE) -> int:
        """The descriptors a transfer of ``files`` distinct chunk files takes (``per_file`` each); ``KVTooManyKeys``
        if it never could."""
        n = files * per_file
        total = self.total
        if n > total:
            raise S3Error(ErrorCode.KVTooManyKeys, f"the descriptor names {files} distinct chunks; this storage server keeps at most "
                          f"{total // per_file} chunk files open for one such kv-get (half its file limit of {self._limit()}, "
                          f"{per_file} descriptor(s) a chunk): split the request, or raise the service's LimitNOFILE",
                          extra={"Field": "chunk_keys"})
        return n

    @contextlib.asynccontextmanager
    async def hold(self, files: int, per_file: int = FDS_PER_FILE, extra: int = 0) -> AsyncIterator[None]:
        """Wait until ``files`` chunk files (and ``extra`` more descriptors: a capacity tier's copies decoding while
        their chunks stream in) fit beside the other transfers', hold them for the block."""
        n = self.need(files, per_file)
        n += max(0, min(extra, self.total - n))  # the extra ones only as far as they could ever fit (never a wait forever)
        async with self._changed:
            self.waiting += 1
            try:
                await self._changed.wait_for(lambda: self.held + n <= self.total)
            finally:
                self.waiting -= 1
            self.held += n
        try:
            yield
        finally:
            async with self._changed:
                self.held -= n
                self._changed.notify_all()

    def try_take(self, files: int, per_file: int = 1) -> int:
        """Take ``files·per_file`` more descriptors now if they fit beside the others' (0: they do not, or never could;
        nothing waits, so a transfer already holding some never waits for more); :meth:`give` them back after."""
        n = files * per_file
        if n > self.total or self.held + n > self.total:
            return 0
        self.held += n
        return n

    async def give(self, n: int) -> None:
        """Descriptors :meth:`try_take` took, given back (wakes transfers waiting for room; given back before the wait
        for the lock, so a cancellation meanwhile loses no descriptors)."""
        if n:
            self.held -= n
            async with self._changed:
                self._changed.notify_all()

    def status(self) -> dict[str, int]:
        return {"total_fds": self.total, "held_fds": self.held, "transfers_waiting": self.waiting}
