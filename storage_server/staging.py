"""A byte budget for the http transport's staging buffers, shared by all transfers, with a share per tenant.

Over ``http`` the storage server stages layer bytes in its own memory before
sending them (two pieces for a layerwise transfer, the whole payload for a
chunkwise one). Without a bound, concurrent http clients could make the daemon
hold any amount of memory; without a per-tenant share, one tenant's transfers
could hold all of it while other tenants wait. Transfers wait here until their
staging fits both the whole budget and their tenant's share; one that needs
more than its share runs when its tenant holds nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class StagingBudget:
    """``total`` bytes for every transfer together; ``tenant_share`` (0 < share <= 1) of it for one tenant's."""

    def __init__(self, total_bytes: int, tenant_share: float = 1.0) -> None:
        self.total = total_bytes
        self.per_tenant = max(1, int(total_bytes * tenant_share))
        self.held = 0
        self.waiting = 0
        self._tenants: dict[str, int] = {}
        self._changed = asyncio.Condition()

    def _fits(self, tenant: str, n: int) -> bool:
        return self.held + n <= self.total and self._tenants.get(tenant, 0) + n <= self.per_tenant

    @contextlib.asynccontextmanager
    async def hold(self, nbytes: int, tenant: str = "") -> AsyncIterator[None]:
        n = min(nbytes, self.per_tenant)
        if n <= 0:
            yield
            return
        async with self._changed:
            self.waiting += 1
            try:
                await self._changed.wait_for(lambda: self._fits(tenant, n))
            finally:
                self.waiting -= 1
            self.held += n
            self._tenants[tenant] = self._tenants.get(tenant, 0) + n
        try:
            yield
        finally:
            async with self._changed:
                self.held -= n
                left = self._tenants.pop(tenant) - n
                if left:
                    self._tenants[tenant] = left
                self._changed.notify_all()

    def status(self) -> dict[str, int]:
        return {"total_bytes": self.total, "held_bytes": self.held, "transfers_waiting": self.waiting}
