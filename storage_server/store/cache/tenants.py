"""Per-tenant bounds and counts of a node's chunk cache: pure bookkeeping (no I/O, no clock).

``cache.tenant_max_bytes`` (or a tenant's own ``cache_max_bytes``) caps what one tenant's
chunks may hold, within ``cache.max_bytes``: a tenant over its bound evicts its own chunks
first (the caller asks the policy for that tenant's victims), so a tenant flooding the
cache cannot push out another's warm prefixes. The counts are what an operator needs to
see eviction: per tenant the chunks its lookups found and missed, its evictions, and for
a chunk evicted and later stored again, the bytes the node stored in between (the
eviction-to-reuse gap: a small gap means the cache is too small for that tenant).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass

from protocol.config import Config

# Evicted chunks remembered for the eviction-to-reuse gap (metadata only).
REMEMBERED_EVICTIONS = 100_000


@dataclass
class TenantCounts:
    hits: int = 0  # chunks kv-lookups found
    misses: int = 0  # chunks kv-lookups asked for past the found prefix
    evictions: int = 0
    evicted_bytes: int = 0
    reused_after_eviction: int = 0  # evicted chunks stored again
    reuse_gap_bytes: int = 0  # sum over those of the bytes stored between eviction and reuse


@dataclass(frozen=True)
class TenantQuotas:
    max_bytes: int  # the node's bound
    default: int = 0  # 0: no per-tenant bound
    per_tenant: tuple[tuple[str, int], ...] = ()

    @classmethod
    def from_config(cls, config: Config) -> TenantQuotas:
        return cls(config.cache.max_bytes, config.cache.tenant_max_bytes,
                   tuple((t.name, t.cache_max_bytes) for t in config.tenants if t.cache_max_bytes))

    def of(self, tenant: str) -> int:
        """The bytes ``tenant`` may hold: its own bound, else the default, never above the node's."""
        own = dict(self.per_tenant).get(tenant, 0) or self.default
        return min(own, self.max_bytes) if own and tenant else self.max_bytes


class TenantLedger:
    def __init__(self, quotas: TenantQuotas) -> None:
        self.quotas = quotas
        self.counts: dict[str, TenantCounts] = {}
        self.clock = 0  # bytes stored on this node
        self._evicted: OrderedDict[str, tuple[str, int]] = OrderedDict()  # chunk identity -> (tenant, clock at eviction)

    def _of(self, tenant: str) -> TenantCounts:
        counts = self.counts.get(tenant)
        if counts is None:
            counts = self.counts[tenant] = TenantCounts()
        return counts

    def seen(self, tenant: str) -> None:
        """A tenant whose chunks the cache holds (from a restart's index)."""
        self._of(tenant)

    def looked_up(self, tenant: str, found: int, asked: int) -> None:
        c = self._of(tenant)
        c.hits += found
        c.misses += asked - found

    def stored(self, tenant: str, ident: str, size: int) -> None:
        self.clock += size
        self._of(tenant)
        gone = self._evicted.pop(ident, None)
        if gone is not None:
            c = self._of(gone[0])
            c.reused_after_eviction += 1
            c.reuse_gap_bytes += self.clock - size - gone[1]

    def evicted(self, tenant: str, ident: str, size: int) -> None:
        c = self._of(tenant)
        c.evictions += 1
        c.evicted_bytes += size
        self._evicted[ident] = (tenant, self.clock)
        if len(self._evicted) > REMEMBERED_EVICTIONS:
            self._evicted.popitem(last=False)

    def tenants(self) -> list[str]:
        return [t for t in self.counts if t]

    def over(self, tenant: str, used: int) -> int:
        """Bytes ``tenant`` holds beyond its bound (0 if within it or it has none)."""
        return max(0, used - self.quotas.of(tenant)) if tenant else 0

    def status(self, used: dict[str, int]) -> dict[str, dict[str, int]]:
        """Per tenant: bytes held, its bound, and the counts."""
        out = {}
        for tenant, c in sorted(list(self.counts.items())):  # list(): one step, also read from the metrics thread
            if tenant:
                out[tenant] = {"bytes": used.get(tenant, 0), "max_bytes": self.quotas.of(tenant), **asdict(c)}
        return out
