"""The shared bandwidth pool for layerwise transfers (I/O glue around ``scheduler``).

A layerwise transfer ``join``s the pool with its demand (bytes per layer,
compute window from the descriptor or the default model) and waits for the
next epoch, which fixes its rate for the whole load. Before each layer it
waits on its token bucket (so it gets its rate), then for a dispatch slot
handed out in weighted deficit-round-robin order (so when the hardware is the
bottleneck every request still gets its share, and a rate above what the
hardware delivers simply runs at hardware speed). Chunkwise transfers bypass
the pool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from protocol.config import BandwidthConfig
from scheduler.epochs import EpochScheduler
from scheduler.pacing import DeficitRoundRobin, TokenBucket
from scheduler.policies import TransferDemand

GBPS = 1e9 / 8  # bytes per second in one Gbps


@dataclass
class Lease:
    """A transfer's place in the pool: its rate and its pacing state."""

    request_id: str
    tenant: str
    rate: float
    epoch: int
    bucket: TokenBucket
    pool: "BandwidthPool"
    admitted_at: float = 0.0
    bytes_sent: int = 0
    last_reserved: int = 0  # the latest layer's bytes: counted in bytes_sent from its start, before it is sent
    _slot_held: bool = field(default=False)

    async def before_layer(self, nbytes: int) -> None:
        delay = self.bucket.reserve(nbytes, self.pool.clock())
        if delay > 0:
            await asyncio.sleep(delay)
        await self.pool._acquire_slot(self, nbytes)
        self._slot_held = True
        self.bytes_sent += nbytes
        self.last_reserved = nbytes

    def after_layer(self) -> None:
        if self._slot_held:
            self._slot_held = False
            self.pool._release_slot()

    def describe(self) -> dict:
        """The allocation, and the rate actually delivered: after the bucket's initial burst of ``b``
        bytes, a paced transfer has started ``b + r·t`` bytes plus the layer it may start early (GCRA
        admits a layer whole at its start), so ``(sent − b − last layer) / t`` estimates r and never
        exceeds it."""
        elapsed = max(self.pool.clock() - self.admitted_at, 1e-9)
        paced = max(self.bytes_sent - self.bucket.burst - self.last_reserved, 0)
        return {"policy": self.pool.config.policy, "rate_bytes_per_s": self.rate, "epoch": self.epoch,
                "delivered_bytes_per_s": paced / elapsed, "bytes_sent": self.bytes_sent}


class BandwidthPool:
    def __init__(self, config: BandwidthConfig, tenant_caps: dict[str, float] | None = None,
                 tenant_weights: dict[str, float] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        """``tenant_caps`` in bytes/s."""
        self.config = config
        self.clock = clock
        self.scheduler = EpochScheduler(
            config.policy, config.capacity_gbps * GBPS, config.epoch_ms / 1000, config.margin_gbps * GBPS,
            dict(tenant_caps or {}), dict(tenant_weights or {}), start=clock(),
        )
        self._demands: dict[str, TransferDemand] = {}
        self._waiters: dict[str, tuple[asyncio.Future, str]] = {}
        self._leases: dict[str, Lease] = {}
        self._drr = DeficitRoundRobin()
        self._free_slots = config.dispatch_slots
        self._epoch_task: asyncio.Task | None = None

    # -- admission ---------------------------------------------------------------
    async def join(self, request_id: str, tenant: str, demand: TransferDemand) -> Lease:
        fut = asyncio.get_running_loop().create_future()
        self.scheduler.submit(request_id, demand, tenant)
        self._waiters[request_id] = (fut, tenant)
        self._demands[request_id] = demand
        self._ensure_epochs()
        try:
            return await fut
        except BaseException:
            self._waiters.pop(request_id, None)
            self._demands.pop(request_id, None)
            self.scheduler.finish(request_id)
            raise

    def leave(self, lease: Lease) -> None:
        lease.after_layer()
        self._leases.pop(lease.request_id, None)
        self._demands.pop(lease.request_id, None)
        for item in self._drr.remove_flow(lease.request_id):
            if not item.done():
                item.cancel()
        self.scheduler.finish(lease.request_id)
        self._ensure_epochs()

    def _ensure_epochs(self) -> None:
        if self._epoch_task is None or self._epoch_task.done():
            self._epoch_task = asyncio.ensure_future(self._epochs())

    async def _epochs(self) -> None:
        """Run boundaries while anything waits or is being released."""
        while self.scheduler.waiting or self.scheduler.finished:
            now = self.clock()
            await asyncio.sleep(max(0.0, self.scheduler.boundary_after(now) - now))
            for a in self.scheduler.run_epoch():
                fut, tenant = self._waiters.pop(a.request_id, (None, ""))
                if fut is None or fut.done():
                    continue
                demand = self._demands[a.request_id]
                bucket = TokenBucket(a.rate, self.config.burst_layers * demand.bytes_per_layer)
                lease = Lease(a.request_id, tenant, a.rate, a.epoch, bucket, self, admitted_at=self.clock())
                self._leases[a.request_id] = lease
                self._drr.add_flow(a.request_id, quantum=max(a.rate, 1.0) if a.rate != float("inf") else 1e18)
                fut.set_result(lease)

    # -- dispatch ----------------------------------------------------------------
    async def _acquire_slot(self, lease: Lease, nbytes: int) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._drr.enqueue(lease.request_id, nbytes, fut)
        self._dispatch()
        await fut

    def _release_slot(self) -> None:
        self._free_slots += 1
        self._dispatch()

    def _dispatch(self) -> None:
        while self._free_slots > 0:
            fut = self._drr.pop()
            if fut is None:
                return
            if fut.done():
                continue
            self._free_slots -= 1
            fut.set_result(None)

    async def close(self) -> None:
        """Stop the epoch loop (at shutdown, once no transfer is left)."""
        if self._epoch_task is not None:
            self._epoch_task.cancel()
            await asyncio.gather(self._epoch_task, return_exceptions=True)

    def status(self) -> dict:
        return {
            "policy": self.config.policy,
            "capacity_bytes_per_s": self.scheduler.capacity,
            "allocated_bytes_per_s": self.scheduler.allocated,
            "epoch": self.scheduler.epoch,
            "waiting": list(self.scheduler.waiting),
            "leases": {rid: {"tenant": l.tenant, **l.describe()} for rid, l in self._leases.items()},
        }
