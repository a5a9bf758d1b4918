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

Before a load, a kv-lookup may ask how much of a prefix lands within a budget
(:class:`protocol.kv_http.LoadBudget`): :func:`deliverable_chunks` answers with the longest prefix
whose last layer is expected in place within :data:`DELIVERY_MARGIN` of the budget at the rate the
pool would grant now, so the engine asks for those chunks only and recomputes the rest (a partial
hit instead of all or nothing); the cut above still guards a load that falls behind anyway.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from protocol.config import Config
from protocol.errors import ErrorCode, S3Error
from protocol.kv_http import LoadBudget
from scheduler.epochs import EpochScheduler
from scheduler.pacing import TokenBucket
from scheduler.policies import TransferDemand

# The share of a budget a predicted load may fill: the prediction leaves out the request path, the
# copy into the engine's memory and a busy host's scheduling, which the rest of the budget absorbs.
DELIVERY_MARGIN = 0.75


def deliverable_chunks(hits: int, skip: int, num_layers: int, chunk_layer_bytes: int, budget_s: float,
                       rate: Callable[[int], float], burst_layers: int = 0, start_wait_s: float = 0.0,
                       margin: float = DELIVERY_MARGIN) -> int:
    """How many of the ``hits`` leading chunks land within ``budget_s`` (pure); chunks before ``skip`` cost nothing.

    Loading ``n`` chunks moves ``num_layers`` layers of ``n·S`` bytes; paced at ``rate(n)`` bytes/s
    (the pool's grant for that demand; ``inf`` when unpaced) with ``burst_layers`` layers of credit
    after ``start_wait_s`` (the next epoch), the last byte is in place after about
    ``start_wait_s + max(0, L − burst_layers)·n·S / r``. The answer is the largest ``n`` that keeps
    this within ``margin·budget_s``, found by shrinking ``n`` while the grant for ``n`` changes
    (a smaller demand may get a smaller rate).
    """
    n = max(0, hits - skip)
    usable = margin * budget_s - start_wait_s
    paced_layers = max(0, num_layers - burst_layers)
    while n > 0:
        r = rate(n)
        if math.isinf(r) or paced_layers == 0:
            break
        fit = 0 if usable <= 0 or r <= 0 else math.floor(usable * r / (paced_layers * chunk_layer_bytes))
        if fit >= n:
            break
        n = fit
    return min(hits, skip + n)


def lookup_deliverable(budget: LoadBudget, hits: int, tenant: str, config: Config, pool: EpochScheduler | None) -> int:
    """A kv-lookup's answer to its :class:`LoadBudget`: the pool's grant now (none: unpaced) through :func:`deliverable_chunks`.

    A load whose payload stays below ``theta_bytes`` goes chunkwise, outside the pool (unpaced).
    """
    L, S = budget.num_layers, budget.per_layer_chunk_bytes
    compute = config.bandwidth.default_compute_per_layer_s

    def rate(n: int) -> float:
        if pool is None or n * L * S < config.storage_server.theta_bytes:
            return math.inf
        return pool.predict_rate(TransferDemand(n * S, compute, L), tenant)

    wait = pool.epoch_s if pool is not None else 0.0  # at most one epoch until the grant
    return deliverable_chunks(hits, budget.skip, L, S, budget.budget_s, rate, config.bandwidth.burst_layers, wait)


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
