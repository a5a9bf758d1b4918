"""The eviction-policy interface a node's chunk cache talks to, and ``cache.policy``'s names.

A policy is pure bookkeeping (no I/O, no clock): the cache tells it what was added,
used together (a prefix chain, head first), pinned and removed, and asks it for
victims. The same objects run online (``ChunkFiles``, ``LocalDiskChunkSource``) and
in the offline replay (``objectcache bench evict``), so the figures the replay prints
are the policy the node runs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Protocol

from protocol.config import CACHE_POLICIES, CacheConfig

from .lru import LruPolicy
from .prefix_tree import PrefixTreePolicy
from .reuse import ReusePolicy

POLICIES = CACHE_POLICIES
DEFAULT_POLICY = CacheConfig().policy


class EvictionPolicy(Protocol):
    used: int

    def __contains__(self, key: str) -> bool: ...
    def __len__(self) -> int: ...
    def size(self, key: str) -> int | None: ...
    def add(self, key: str, size: int, parent: str | None = None, tenant: str = "") -> None: ...
    def add_chain(self, items: list[tuple[str, int]], parent: str | None = None, tenant: str = "") -> None: ...
    def tenant_used(self, tenant: str) -> int: ...
    def tenant_of(self, key: str) -> str: ...
    # ``fresh``: keys of the chain this very request brought into the cache (its misses): used, not reused.
    def touch_chain(self, keys: Iterable[str], fresh: Collection[str] = ()) -> None: ...
    def pin(self, keys: Iterable[str]) -> None: ...
    def unpin(self, keys: Iterable[str]) -> None: ...
    def pinned(self, key: str) -> bool: ...
    @property
    def pinned_bytes(self) -> int: ...
    def remove(self, key: str) -> int: ...
    def victims(self, need: int, partial: bool = False, tenant: str | None = None) -> list[str] | None: ...


def make_policy(name: str) -> EvictionPolicy:
    """The policy ``cache.policy`` names (validated by the config schema)."""
    if name == "lru":
        return LruPolicy()
    if name == "prefix":
        return PrefixTreePolicy()
    if name == "reuse":
        return ReusePolicy()
    raise ValueError(f"cache.policy: unknown policy {name!r} (supported: {', '.join(POLICIES)})")
