"""Which cached chunks to evict: least recently used first, never a pinned one, the tail of a prefix before its head.

A pure policy (no I/O, no clock), after LMCache's ``cache_policy/lru.py``. A prefix is
only useful from its head: a lookup counts *leading* chunks, so evicting a head makes
every chunk behind it dead weight. Touching a chain therefore moves its chunks to the
most-recently-used end in reverse order: the head ends up newest, the tail oldest, and
eviction eats prefixes from the back. Pinned chunks (held by a transfer) are skipped.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable

from .pins import PinCounts


class LruPolicy(PinCounts):
    def __init__(self) -> None:
        self._sizes: OrderedDict[str, int] = OrderedDict()  # oldest first
        self._pins: dict[str, int] = {}
        self._tenants: dict[str, str] = {}  # key -> tenant, for keys of a named tenant
        self._tenant_used: dict[str, int] = {}
        self.used = 0

    def __contains__(self, key: str) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def size(self, key: str) -> int | None:
        return self._sizes.get(key)

    def add(self, key: str, size: int, parent: str | None = None, tenant: str = "") -> None:
        """A new entry of ``tenant``, newest (replacing one of the same key); LRU has no use for its ``parent`` in the chain."""
        self.remove(key)
        self._sizes[key] = size
        self.used += size
        if tenant:
            self._tenants[key] = tenant
            self._tenant_used[tenant] = self._tenant_used.get(tenant, 0) + size

    def add_chain(self, items: list[tuple[str, int]], parent: str | None = None, tenant: str = "") -> None:
        """Newly stored chunks of one chain, head first: added tail first, so the head is the newest."""
        for key, size in reversed(items):
            self.add(key, size, None, tenant)

    def tenant_used(self, tenant: str) -> int:
        return self._tenant_used.get(tenant, 0)

    def tenant_of(self, key: str) -> str:
        return self._tenants.get(key, "")

    def touch_chain(self, keys: Iterable[str], fresh: Collection[str] = ()) -> None:
        """``keys`` in prefix order were used together: the head becomes the newest, the tail the oldest of them
        (fresh ones too: recency does not tell a first use from a reuse)."""
        for key in reversed(list(keys)):
            if key in self._sizes:
                self._sizes.move_to_end(key)

    @property
    def pinned_bytes(self) -> int:
        return sum(self._sizes.get(k, 0) for k in self._pins)

    def remove(self, key: str) -> int:
        """Forget ``key`` (pinned or not); its size, 0 if it was not there."""
        size = self._sizes.pop(key, 0)
        self.used -= size
        tenant = self._tenants.pop(key, "")
        if tenant:
            self._tenant_used[tenant] -= size
        return size

    def victims(self, need: int, partial: bool = False, tenant: str | None = None) -> list[str] | None:
        """Unpinned entries (of ``tenant`` only, if given), oldest first, whose sizes add up to at least ``need``.

        If even all of them are not enough: None, or with ``partial`` all of them.
        """
        out: list[str] = []
        freed = 0
        for key, size in self._sizes.items():
            if freed >= need:
                break
            if key not in self._pins and (tenant is None or self._tenants.get(key, "") == tenant):
                out.append(key)
                freed += size
        return out if freed >= need or partial else None
