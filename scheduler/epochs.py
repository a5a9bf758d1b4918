"""Epoch-based admission: rates are fixed per epoch and kept for a request's whole load.

Pure state machine: the caller supplies the time. A request that arrives
mid-epoch waits for the next boundary; at each boundary the bandwidth of
requests that finished during the last epoch returns to the pool, and the
waiting requests are admitted with rates from the policy over what is free
(the running ones keep theirs). Per-tenant caps bound a tenant's total rate;
per-tenant weights scale its requests' share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .policies import TransferDemand, allocate


@dataclass(frozen=True)
class Admitted:
    request_id: str
    tenant: str
    rate: float
    epoch: int


@dataclass
class EpochScheduler:
    policy: str
    capacity: float
    epoch_s: float
    margin: float = 0.0
    tenant_caps: dict[str, float] = field(default_factory=dict)
    tenant_weights: dict[str, float] = field(default_factory=dict)
    start: float = 0.0
    # Admissions below this rate wait for a later epoch (avoids near-zero rates).
    min_rate: float = 0.0

    def __post_init__(self) -> None:
        if not (self.epoch_s > 0 and math.isfinite(self.epoch_s)):
            raise ValueError("epoch_s must be positive")
        self.epoch = 0
        self.waiting: dict[str, tuple[TransferDemand, str]] = {}
        self.running: dict[str, Admitted] = {}
        self.finished: list[str] = []

    def boundary_after(self, now: float) -> float:
        """The first epoch boundary strictly after ``now``."""
        k = math.floor((now - self.start) / self.epoch_s) + 1
        return self.start + k * self.epoch_s

    def submit(self, request_id: str, demand: TransferDemand, tenant: str = "") -> None:
        if request_id in self.waiting or request_id in self.running:
            raise ValueError(f"request {request_id!r} is already scheduled")
        weight = self.tenant_weights.get(tenant, 1.0)
        self.waiting[request_id] = (replace(demand, weight=demand.weight * weight), tenant)

    def finish(self, request_id: str) -> None:
        """The load is done (or cancelled); its bandwidth returns at the next epoch."""
        if self.waiting.pop(request_id, None) is None and request_id in self.running:
            self.finished.append(request_id)

    @property
    def allocated(self) -> float:
        return sum(a.rate for a in self.running.values())

    def run_epoch(self) -> list[Admitted]:
        """Process one boundary: release finished loads, admit waiting ones. Returns the new admissions."""
        self.epoch += 1
        for rid in self.finished:
            self.running.pop(rid, None)
        self.finished = []
        free = self.capacity - self.allocated
        if not self.waiting or free <= 0:
            return []
        ids = list(self.waiting)
        demands = [self.waiting[r][0] for r in ids]
        rates = allocate(self.policy, demands, free, self.margin)
        rates = self._apply_tenant_caps(ids, rates)
        admitted = []
        for rid, rate in zip(ids, rates):
            demand, tenant = self.waiting[rid]
            if demand.bytes_per_layer == 0 or rate > self.min_rate:
                a = Admitted(rid, tenant, rate if demand.bytes_per_layer else math.inf, self.epoch)
                del self.waiting[rid]
                if demand.bytes_per_layer:
                    self.running[rid] = a
                admitted.append(a)
        return admitted

    def predict_rate(self, demand: TransferDemand, tenant: str = "") -> float:
        """The rate a request submitted now would get at the next boundary (nothing changes; 0: it would wait longer).

        What :meth:`run_epoch` would do with ``demand`` beside the requests already waiting: the
        loads finished in this epoch give their bandwidth back, the policy shares what is free,
        and the tenant's cap scales the share down.
        """
        if demand.bytes_per_layer == 0:
            return math.inf
        released = sum(self.running[r].rate for r in self.finished if r in self.running)
        free = self.capacity - self.allocated + released
        if free <= 0:
            return 0.0
        mine = replace(demand, weight=demand.weight * self.tenant_weights.get(tenant, 1.0))
        rates = allocate(self.policy, [d for d, _ in self.waiting.values()] + [mine], free, self.margin)
        rate = rates[-1]
        cap = self.tenant_caps.get(tenant)
        if cap is not None:
            held = sum(a.rate for rid, a in self.running.items() if a.tenant == tenant and rid not in self.finished)
            asked = rate + sum(r for (_, t), r in zip(self.waiting.values(), rates) if t == tenant)
            room = max(0.0, cap - held)
            if asked > room:
                rate *= room / asked if asked else 0.0
        return rate if rate > self.min_rate else 0.0

    def _apply_tenant_caps(self, ids: list[str], rates: list[float]) -> list[float]:
        """Scale a tenant's new rates down so its total stays within its cap (the excess stays free)."""
        out = list(rates)
        for tenant, cap in self.tenant_caps.items():
            idx = [i for i, rid in enumerate(ids) if self.waiting[rid][1] == tenant]
            if not idx:
                continue
            held = sum(a.rate for a in self.running.values() if a.tenant == tenant)
            room = max(0.0, cap - held)
            asked = sum(out[i] for i in idx)
            if asked > room:
                scale = room / asked if asked else 0.0
                for i in idx:
                    out[i] *= scale
        return out
