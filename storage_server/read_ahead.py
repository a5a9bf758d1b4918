"""Read-ahead of a transfer's page-cache layers, paced by the layer being read (the window and frontier are the plan's
pure decisions, :func:`storage_server.read_path.read_ahead_frontier`).

Before, all n₁ page-cache layers were asked ahead at once (``fadvise(WILLNEED)`` from a thread beside the layer
reads): the first layer's reads then shared the disk, the two cores and the memory cgroup with up to the whole budget
of later layers' read-ahead. Here the executor's pacer hook asks for each layer's pages just before it is read
(awaited: the readers then fault on pages already queued, one deep batch) and for the window's next layers in the
background, so layer 0 is read with nothing queued beside it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .read_path import read_ahead_frontier
from .read_plan import ReadPlan
from .residency import read_ahead

if TYPE_CHECKING:
    from .executor import Pacer


def layer_order(plan: ReadPlan, first: int, last: int, group: int) -> tuple[list[int], list[int], list[int]]:
    """Read-ahead ranges of layers first..last-1 in the order the transfer consumes them: a group of layers of every
    chunk, then the next group (chunk by chunk, the first layer would wait for the last chunk's every layer)."""
    s = plan.descriptor.per_layer_chunk_bytes
    fds, offsets, sizes = [], [], []
    for a in range(first, last, group):
        n = min(group, last - a) * s
        for fd, offset in zip(plan.fds, plan.offsets):
            fds.append(fd)
            offsets.append(offset + a * s)
            sizes.append(n)
    return fds, offsets, sizes


class WindowedReadAhead:
    """A :class:`Pacer` around the transfer's own (or none) that asks the page cache for layers as the window moves.

    ``budget``: bytes it may ask for in all (the plan's ``read_ahead_bytes``); ``asked``: what it asked for."""

    def __init__(self, plan: ReadPlan, page_cache_layers: int, window: int, budget: int, group: int = 1, inner: Pacer | None = None) -> None:
        self.plan, self.n1, self.window, self.budget, self.group, self.inner = plan, page_cache_layers, window, budget, group, inner
        self.next_layer = 0  # the layer the next before_layer is for
        self.frontier = 0  # layers 0..frontier-1 asked for
        self.reserved = 0  # of ``budget``, what the advices given out may ask for (counted on the loop)
        self.asked = 0  # what the finished advices asked for
        self._pending: list[asyncio.Future] = []

    def _dispatch(self, first: int, last: int) -> asyncio.Future:
        """Advice of layers first..last-1 on a thread (fadvise may block on a full device queue), within the budget left."""
        allowed = min(len(self.plan.fds) * (last - first) * self.plan.descriptor.per_layer_chunk_bytes, self.budget - self.reserved)
        self.reserved += allowed
        ranges = layer_order(self.plan, first, last, self.group)
        return asyncio.get_running_loop().run_in_executor(None, read_ahead, *ranges, allowed)

    def start(self) -> None:
        """Window 0 (a chunkwise transfer, or read_ahead_window_bytes = 0): every page-cache layer asked for now, in the
        background; a windowed one starts at its first layer's ``before_layer``."""
        if self.window <= 0 and self.n1 > 0 and self.budget > 0:
            self.frontier = self.n1
            self._pending.append(self._dispatch(0, self.n1))

    async def ask(self, layer: int) -> None:
        """Move the window for ``layer``: its own pages awaited, those of the layers ahead of it in the background."""
        target = read_ahead_frontier(layer, self.n1, self.window)
        if target <= self.frontier or self.reserved >= self.budget:
            return
        now = max(self.frontier, min(target, layer + 1))
        first, self.frontier = self.frontier, target
        if now > first:
            self.asked += await self._dispatch(first, now)
        if target > now:
            self._pending.append(self._dispatch(now, target))

    async def before_layer(self, nbytes: int) -> None:
        layer, self.next_layer = self.next_layer, self.next_layer + 1
        if layer < self.n1:
            await self.ask(layer)
        if self.inner is not None:
            await self.inner.before_layer(nbytes)

    def after_layer(self) -> None:
        if self.inner is not None:
            self.inner.after_layer()

    async def settle(self) -> int:
        """Wait for every advice still running (the pinned fds stay open until then); the bytes asked for."""
        pending, self._pending = self._pending, []
        for got in await asyncio.gather(*pending, return_exceptions=True):
            self.asked += got if isinstance(got, int) else 0
        return self.asked
