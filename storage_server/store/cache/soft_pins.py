"""Soft pins: chunks an operator marks hot (a system prompt) stay cached until a deadline, within a per-tenant bound.

Pure bookkeeping (the caller passes ``now``; no I/O): the cache pins a soft-pinned chunk in its
eviction policy (one pin count, like a transfer's, so no policy evicts it) and unpins it when
``expired`` says its deadline passed. A mark is all or none: one that would take a tenant's
soft-pinned bytes beyond ``cache.soft_pin_tenant_max_bytes`` is refused before anything is
stored, so one tenant cannot pin the node full. Marking a chunk again moves its deadline.
After Mooncake's soft pins with a TTL.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass


class SoftPinRefused(ValueError):
    """A mark the bound or the TTL limit does not allow; the message names the config key."""


@dataclass(frozen=True)
class SoftPinLimits:
    tenant_max_bytes: int = 0  # 0: soft pins are off
    max_ttl_s: float = 3600.0


@dataclass
class _Pin:
    tenant: str
    size: int
    until: float


class SoftPins:
    def __init__(self, limits: SoftPinLimits) -> None:
        self.limits = limits
        self._pins: dict[str, _Pin] = {}
        self._tenant_bytes: dict[str, int] = {}
        self._deadlines: list[tuple[float, str]] = []  # (until, key); stale entries skipped

    def check(self, tenant: str, items: list[tuple[str, int]], ttl_s: float) -> None:
        """Raise SoftPinRefused unless ``tenant`` may soft-pin ``items`` (key, bytes) for ``ttl_s`` seconds."""
        if not self.limits.tenant_max_bytes:
            raise SoftPinRefused("soft pins are off on this node (cache.soft_pin_tenant_max_bytes = 0)")
        if not 0 < ttl_s <= self.limits.max_ttl_s:
            raise SoftPinRefused(f"soft-pin TTL {ttl_s:g} s is not within (0, cache.soft_pin_max_ttl_s = {self.limits.max_ttl_s:g}]")
        held = self._tenant_bytes.get(tenant, 0)
        new = sum(size for key, size in dict(items).items() if key not in self._pins)
        if held + new > self.limits.tenant_max_bytes:
            raise SoftPinRefused(f"tenant {tenant!r} would soft-pin {held + new} bytes, more than "
                                 f"cache.soft_pin_tenant_max_bytes = {self.limits.tenant_max_bytes}")

    def mark(self, tenant: str, items: list[tuple[str, int]], ttl_s: float, now: float) -> list[str]:
        """Soft-pin ``items`` until ``now + ttl_s`` (checked first); the keys not soft-pinned before (the caller pins those)."""
        self.check(tenant, items, ttl_s)
        until = now + ttl_s
        fresh = []
        for key, size in items:
            pin = self._pins.get(key)
            if pin is None:
                self._pins[key] = _Pin(tenant, size, until)
                self._tenant_bytes[tenant] = self._tenant_bytes.get(tenant, 0) + size
                fresh.append(key)
            else:
                pin.until = until
            heapq.heappush(self._deadlines, (until, key))
        return fresh

    def expired(self, now: float) -> list[str]:
        """Keys whose deadline passed, forgotten here (the caller unpins them)."""
        out = []
        while self._deadlines and self._deadlines[0][0] <= now:
            until, key = heapq.heappop(self._deadlines)
            pin = self._pins.get(key)
            if pin is not None and pin.until == until:
                self._forget(key, pin)
                out.append(key)
        return out

    def drop(self, key: str) -> bool:
        """Forget ``key`` (its chunk is gone); whether it was soft-pinned (the caller unpins it)."""
        pin = self._pins.get(key)
        if pin is not None:
            self._forget(key, pin)
        return pin is not None

    def _forget(self, key: str, pin: _Pin) -> None:
        del self._pins[key]
        self._tenant_bytes[pin.tenant] -= pin.size

    def __contains__(self, key: str) -> bool:
        return key in self._pins

    def tenant_bytes(self, tenant: str) -> int:
        return self._tenant_bytes.get(tenant, 0)

    def status(self) -> dict[str, int]:
        return {t: b for t, b in self._tenant_bytes.items() if b}
