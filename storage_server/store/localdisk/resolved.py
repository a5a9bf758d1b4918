"""Prefixes pinned before, kept resolved while the metadata is unchanged: a repeat pins in O(1).

Profiled (py-spy, ``bench peers`` G=16, 3,584 chunks, a repeated prefix): pinning cost 5–17 ms
before the first layer — per key a location lookup, a name built, a policy pin and an open-file
cache reference — and releasing 5–14 ms more. A serving engine asks for the same prefix again and
again, and the protocol decodes equal key bytes to the very same list (:class:`protocol.wire.KeyList`),
so what a pin resolved is kept here under that list and reused: the entry itself holds the chunks'
policy pins and open-file references between transfers, and a transfer only counts itself in.

Sound for the reason :mod:`.locations` is: an entry is used only while SQLite's ``data_version``
equals the version it was resolved at, so any commit by anybody (a put, delete or overwrite in
either process) drops every entry before it could be used (entries still in use are dropped when
their last transfer ends). Idle entries keep their chunks pinned, so an eviction that needs room
drops them first (:meth:`ResolvedPrefixes.drop_idle`), and they hold at most half the open-file
cache. Used on the event loop only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from ..chunk_source import PinnedChunks
from ..mapped_files import MappedSlot
from ..open_files import OpenFileCache

MAX_ENTRIES = 64


@dataclass(eq=False)
class Resolved:
    """One prefix of one bucket as a pin resolved it, holding its chunks (policy pins, open files) while cached."""

    bucket: str
    keys: list[str]  # the very list it was resolved for: entries are found by its identity
    paths: list[str]
    names: list[str]
    sizes: list[int]
    fds: list[int]
    slots: list[MappedSlot | None]
    holders: int = 0  # transfers reading it now
    stale: bool = False  # dropped from the cache while in use: let go when its last transfer ends
    derived: dict = field(default_factory=dict)  # what readers derive from these pins (the executor's row indices)


class ResolvedPrefixes:
    """The cache of :class:`Resolved` entries; ``let_go(entry)`` unpins an entry's chunks (the source's job)."""

    def __init__(self, files: OpenFileCache, let_go: Callable[[Resolved], None], max_entries: int = MAX_ENTRIES) -> None:
        self.files = files
        self._let_go = let_go
        self.max_entries = max_entries
        self.max_keys = files.capacity // 2
        self._entries: OrderedDict[tuple[str, int], Resolved] = OrderedDict()
        self._keys = 0
        self.version: int | None = None
        self.hits = self.misses = self.dropped = 0

    def check(self, version: int) -> None:
        """Forget every entry if the metadata changed since they were resolved."""
        if version != self.version:
            self.clear()
            self.version = version

    def get(self, bucket: str, keys: list[str], version: int) -> Resolved | None:
        """The entry resolved for exactly this list of this bucket at ``version`` (the current one), or None."""
        self.check(version)
        entry = self._entries.get((bucket, id(keys)))
        if entry is None or entry.keys is not keys:
            self.misses += 1
            return None
        self._entries.move_to_end((bucket, id(keys)))
        self.hits += 1
        return entry

    def fits(self, n: int) -> bool:
        return 0 < n <= self.max_keys

    def add(self, entry: Resolved, version: int | None) -> bool:
        """Keep ``entry`` (it holds its pins from now on) if it was resolved at the current version; False if not kept."""
        if version is None or version != self.version or not self.fits(len(entry.keys)):
            return False
        old = self._entries.pop((entry.bucket, id(entry.keys)), None)
        if old is not None:
            self._retire(old)
        self._entries[(entry.bucket, id(entry.keys))] = entry
        self._keys += len(entry.keys)
        while len(self._entries) > self.max_entries or self._keys > self.max_keys:
            self._retire(self._entries.popitem(last=False)[1])
        return True

    def pinned(self, entry: Resolved, release: Callable[[], None]) -> PinnedChunks:
        """A transfer's hold on ``entry``; ``release`` runs when it ends (exactly once)."""
        entry.holders += 1
        return PinnedChunks(entry.fds, [0] * len(entry.fds), entry.sizes, entry.slots, release, derived=entry.derived)

    def done(self, entry: Resolved) -> None:
        """A transfer of ``entry`` ended."""
        entry.holders -= 1
        if entry.stale and not entry.holders:
            self._let_go(entry)

    def _retire(self, entry: Resolved) -> None:
        self._keys -= len(entry.keys)
        self.dropped += 1
        entry.stale = True
        if not entry.holders:
            self._let_go(entry)

    def drop_idle(self) -> int:
        """Unpin the entries no transfer reads (an eviction needs room); how many."""
        idle = [k for k, e in self._entries.items() if not e.holders]
        for k in idle:
            self._retire(self._entries.pop(k))
        return len(idle)

    def clear(self) -> None:
        entries, self._entries = list(self._entries.values()), OrderedDict()
        for e in entries:
            self._retire(e)
        self._keys = 0

    def kept_files(self) -> dict[str, int]:
        """Open-file references the idle entries hold (path -> count): files kept for a repeat, not in use."""
        kept: dict[str, int] = {}
        for e in self._entries.values():
            if not e.holders:
                for p in e.paths:
                    kept[p] = kept.get(p, 0) + 1
        return kept

    def status(self) -> dict[str, int]:
        return {"entries": len(self._entries), "keys": self._keys, "hits": self.hits, "misses": self.misses, "dropped": self.dropped}
