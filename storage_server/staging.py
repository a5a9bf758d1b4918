"""A byte budget for the http transport's staging buffers, shared by all transfers.

Over ``http`` the storage server stages layer bytes in its own memory before
sending them (two layers for a layerwise transfer, the whole payload for a
chunkwise one): a full-size 64K-token G=16 layer is 235 MB. Without a bound,
concurrent http clients could make the daemon hold any amount of memory.
Transfers wait here until their staging fits; one that needs more than the
whole budget runs when nothing else holds any.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class StagingBudget:
    def __init__(self, total_bytes: int) -> None:
        self.total = total_bytes
        self.held = 0
        self.waiting = 0
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def hold(self, nbytes: int) -> AsyncIterator[None]:
        n = min(nbytes, self.total)
        if n <= 0:
            yield
            return
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

    def status(self) -> dict[str, int]:
        return {"total_bytes": self.total, "held_bytes": self.held, "transfers_waiting": self.waiting}
