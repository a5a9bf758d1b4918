"""Load budgets on the storage server: a layerwise kv-get is cut at the first layer boundary it cannot make.

A descriptor may carry ``load_budget_s``: the engine recomputes whatever is not in place that long
after the server received the kv-get, so bytes sent later are wasted, and the bandwidth they hold
is another transfer's. The server knows when each layer can start: now plus the wait its
bandwidth lease's token bucket imposes (the pool's epoch wait and any staging wait have already
been spent). Before each layer (a group of layers on the ``O_DIRECT`` path) it asks
:func:`layer_in_time`; a layer expected to start after the deadline ends the transfer with
``KVLoadBudgetExceeded`` right then, not when the budget runs out, so the engine starts its
recompute early and the pool's share goes to transfers that can still make theirs. Chunkwise
transfers (small ones) have no layer boundary and are not cut.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from protocol.errors import ErrorCode, S3Error
from scheduler.pacing import TokenBucket


def layer_in_time(now: float, wait_s: float, deadline: float) -> bool:
    """Whether a layer that may start ``wait_s`` from ``now`` starts by ``deadline`` (pure)."""
    return now + wait_s <= deadline


@dataclass
class LoadDeadline:
    """A pacer that refuses to start a layer it expects to start after the transfer's deadline.

    ``deadline`` is on ``clock``; ``bucket`` (the lease's, on ``bucket_clock``) says how long the
    next layer must wait for its rate; ``None`` when the transfer is not paced.
    """

    deadline: float
    budget_s: float
    bucket: TokenBucket | None = None
    bucket_clock: Callable[[], float] = time.monotonic
    clock: Callable[[], float] = time.perf_counter
    boundary: int = 0  # layer boundaries passed (layers, or layer groups on the O_DIRECT path)

    async def before_layer(self, nbytes: int) -> None:
        now = self.clock()
        wait = self.bucket.wait_s(self.bucket_clock()) if self.bucket is not None else 0.0
        if not layer_in_time(now, wait, self.deadline):
            late = now + wait - self.deadline
            raise S3Error(ErrorCode.KVLoadBudgetExceeded,
                          f"layer boundary {self.boundary} would start {late:.3f} s after the load budget of {self.budget_s:g} s "
                          f"(load_budget_s); the layers before it were delivered",
                          extra={"Field": "load_budget_s", "LayerBoundary": str(self.boundary)})
        self.boundary += 1

    def after_layer(self) -> None:
        pass
