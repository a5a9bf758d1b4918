"""Touches of served chains wait until the eviction policy is next asked something that depends on them.

Every kv-get ends with ``touch_chain`` of its prefix: each chunk becomes the most recently used
and is re-priced. That is per-chunk Python on the event loop: 30 ms for a 3,584-chunk prefix under
``reuse`` (py-spy, back-to-back shm kv-gets: 30% of the storage server's loop, and the next
kv-get's first layer waited behind it). Recency only matters when the policy chooses victims, or
when chunks are added or removed (links, outcomes), so touches are queued here and applied then,
in order. A chain touched again while queued (a kept prefix served repeatedly: the same list of
names) moves to the back of the queue instead of being queued twice: the uses of one prefix
between two decisions count as one, which is what recency can tell apart anyway.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from .policy import EvictionPolicy


class DeferredTouches:
    """An :class:`EvictionPolicy` that queues ``touch_chain`` until ``add``, ``add_chain``, ``remove`` or ``victims``."""

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        # id(keys) -> (keys, fresh) (the keys held, so the id is not reused meanwhile)
        self._pending: dict[int, tuple[Iterable[str], Collection[str]]] = {}

    def touch_chain(self, keys: Iterable[str], fresh: Collection[str] = ()) -> None:
        if not isinstance(keys, (list, tuple)):
            keys = list(keys)  # an iterator is read now, while what it walks is as the caller meant
        self._pending.pop(id(keys), None)
        self._pending[id(keys)] = (keys, fresh)

    def flush(self) -> None:
        """Apply the queued touches, oldest first."""
        while self._pending:
            pending, self._pending = self._pending, {}
            for keys, fresh in pending.values():
                self.policy.touch_chain(keys, fresh)

    # What depends on recency: the queue is applied first.
    def add(self, key: str, size: int, parent: str | None = None, tenant: str = "") -> None:
        self.flush()
        self.policy.add(key, size, parent, tenant)

    def add_chain(self, items: list[tuple[str, int]], parent: str | None = None, tenant: str = "") -> None:
        self.flush()
        self.policy.add_chain(items, parent, tenant)

    def remove(self, key: str) -> int:
        self.flush()
        return self.policy.remove(key)

    def victims(self, need: int, partial: bool = False, tenant: str | None = None) -> list[str] | None:
        self.flush()
        return self.policy.victims(need, partial, tenant)

    # What does not: straight through (pins are taken on a kv-get's path).
    @property
    def used(self) -> int:
        return self.policy.used

    @property
    def pinned_bytes(self) -> int:
        return self.policy.pinned_bytes

    def __contains__(self, key: str) -> bool:
        return key in self.policy

    def __len__(self) -> int:
        return len(self.policy)

    def size(self, key: str) -> int | None:
        return self.policy.size(key)

    def tenant_used(self, tenant: str) -> int:
        return self.policy.tenant_used(tenant)

    def tenant_of(self, key: str) -> str:
        return self.policy.tenant_of(key)

    def pin(self, keys: Iterable[str]) -> None:
        self.policy.pin(keys)

    def unpin(self, keys: Iterable[str]) -> None:
        self.policy.unpin(keys)

    def pinned(self, key: str) -> bool:
        return self.policy.pinned(key)
