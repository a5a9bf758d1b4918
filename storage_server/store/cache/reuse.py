"""Evict the leaf least likely to be used again, with the odds learnt online per kind of chunk (pure, no I/O, no clock).

Why learnt and not a fixed worth: on the public Mooncake conversation trace the fixed
"hits + lineage" worth of :mod:`.prefix_tree` falls below LRU (67% vs 76% of Belady's hits
at a 10% cache): rewarding hits by whole cache turnovers keeps dead conversations. An LRU
that knew which chunks are never used again would match Belady on that trace, so the gap
is all in *predicting reuse*; what the traces let a node predict differs between them (a
conversation's later turns are continued more often than its first: 31% at turn 0, 42%,
51%, 59% at turns 1–3 on the conversation trace, 17% against 75–80% on the synthetic one;
the partial last chunk of a prompt that the next turn replaces: <2% reused), so the policy
counts, per class of chunk, how many entered it and how many were used again, and ages a
chunk by how unlikely its class makes a reuse:

    priority = clock at last use + horizon × ln(p̂(class) / p̂(all))      (evict the lowest leaf first)

With equal odds this is the prefix tree's LRU (tails before heads). ``horizon`` is how long
chunks wait for their hits (the mean byte-clock age at which cached chunks are hit, capped
by the cache's size): one e-fold of odds moves a chunk by one typical reuse distance. With
the cache's size as the horizon instead, a large cache (20%) evicted low-odds chunks a whole
turnover early, losing the long tail of their reuses while extending high-odds ones past the
age where hardly any reuse is left (below LRU by 0.7% of hits). Classes: a new run of
chunks by where it hangs (no parent / below a root / deeper) and the fan-out of the chunk it
hangs below when stored (a leaf or a lone child: it continues a chain, a conversation's next
turn; a chunk with several children: a branch off a shared prompt), the run's first chunk,
body and end apart; a chunk asked for again after its eviction (ghost list); a chunk hit n
times (n ≤ 3).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict

from .prefix_tree import PrefixTreePolicy, _Node

Kind = tuple[str, ...]
# A class's odds start at the odds of all chunks (as if it had seen PRIOR chunks of them: a rare class is
# not trusted more than the whole), and its counts are halved once it saw MEMORY chunks (keeps adapting).
PRIOR, MEMORY = 2.0, 20000
# Reuses seen (all classes) before the odds shape the order.
MIN_REUSES = 32
# Typical reuse distances (the mean age at a hit) a chunk is aged per e-fold drop of its reuse odds.
HORIZON = 2.0
# Weight of one hit's age in the running mean of hit ages.
HIT_AGE_WEIGHT = 0.01


class ReusePolicy(PrefixTreePolicy):
    def __init__(self, horizon: float = HORIZON) -> None:
        super().__init__()
        self.horizon = horizon
        self._odds: dict[Kind, list[float]] = {}  # class -> [evicted unused, used again]
        self._all = [0.0, 0.0]  # every class: [evicted unused, used again]
        self._high = 1
        self._kind: dict[str, Kind] = {}
        self._ghost_kind: OrderedDict[str, Kind] = OrderedDict()
        self._last: dict[str, int] = {}  # key -> byte clock at its last store or hit
        self.hit_age: float | None = None  # running mean of the byte-clock age at which chunks are hit

    def odds(self, kind: Kind) -> float:
        """How often a chunk of ``kind`` was used again rather than evicted unused (outcomes only: a chunk still
        cached and unused is undecided, since reuse distances are long and counting it would read as 'never')."""
        unused, reused = self._odds.get(kind, (0.0, 0.0))
        return (reused + PRIOR * self.overall()) / (unused + reused + PRIOR)

    def overall(self) -> float:
        return (self._all[1] + 1.0) / (self._all[0] + self._all[1] + 2.0)

    def _count(self, kind: Kind | None, outcome: int) -> None:
        """One outcome of a chunk of ``kind``: 0 evicted unused, 1 used again."""
        if kind is None:
            return
        seen = self._odds.setdefault(kind, [0.0, 0.0])
        seen[outcome] += 1
        self._all[outcome] += 1
        if seen[0] + seen[1] > MEMORY:
            seen[0], seen[1] = seen[0] / 2, seen[1] / 2
        if self._all[0] + self._all[1] > MEMORY * 4:
            self._all = [self._all[0] / 2, self._all[1] / 2]

    def _reprice(self, key: str, node: _Node) -> None:
        kind = self._kind.get(key)
        # In units of the mean hit age, at most the most ever cached (the cache's size once full: a chunk priced
        # while the cache filled up must not outlive later ones), relative to the odds of all chunks (an average
        # one is LRU). Until MIN_REUSES reuses were seen, plain recency: with none seen, every class's odds only say
        # how many chunks it has (fewer look better), which evicted the bulk of new chains first.
        self._high = max(self._high, self.used)
        shift = 0.0
        if self._all[1] >= MIN_REUSES:
            shift = math.log(self.odds(kind if kind is not None else ("unknown",)) / self.overall())
        reach = self._high if self.hit_age is None else min(self._high, self.hit_age)
        node.prio = self.clock + self.horizon * reach * shift
        if not node.children:
            heapq.heappush(self._heap, (node.prio, next(self._seq), key))

    def add(self, key: str, size: int, parent: str | None = None, tenant: str = "") -> None:
        """One chunk stored alone (a chain's end unknown): a body chunk of its run."""
        self._store([(key, size)], parent, tenant, False)

    def _where(self, parent: str | None) -> tuple[str, str]:
        """Where a run stored below ``parent`` hangs, and the fan-out of ``parent`` then (before the run is linked)."""
        up = self._nodes.get(parent) if parent is not None else None
        if up is None:
            return ("head" if parent is None else "orphan"), ""
        return ("below-root" if up.depth == 0 else "deeper"), ("leaf" if not up.children else "one" if len(up.children) == 1 else "many")

    def add_chain(self, items: list[tuple[str, int]], parent: str | None = None, tenant: str = "") -> None:
        self._store(items, parent, tenant, True)

    def _store(self, items: list[tuple[str, int]], parent: str | None, tenant: str, ends: bool) -> None:
        """A run of new chunks below ``parent``, classed by where the run hangs; with ``ends``, its last chunk ends its chain."""
        where, fan = self._where(parent)
        for i, (key, size) in enumerate(items):
            self.remove(key)
            ghost = self._ghost_kind.pop(key, None)
            if ghost is not None:  # stored, evicted, asked for again: its old class was right to expect a reuse
                self._count(ghost, 1)
                self._kind[key] = ("again",)
            else:
                self._kind[key] = ("new", where if i == 0 else "run", fan, "end" if ends and i == len(items) - 1 else "body")
            PrefixTreePolicy.add(self, key, size, parent, tenant)
            self._last[key] = self.clock
            parent = key

    def touch_chain(self, keys, fresh=()) -> None:  # type: ignore[no-untyped-def]
        keys = list(keys)
        for key in keys:
            if key in self._nodes and key not in fresh:  # a fresh key's first use is its class's entry, not a reuse
                age = self.clock - self._last.get(key, self.clock)
                self.hit_age = age if self.hit_age is None else self.hit_age + HIT_AGE_WEIGHT * (age - self.hit_age)
                self._last[key] = self.clock
                kind = self._kind.get(key)
                self._count(kind, 1)
                hits = int(kind[1]) + 1 if kind is not None and kind[0] == "hit" else 1
                self._kind[key] = ("hit", str(min(hits, 3)))
        super().touch_chain(keys, fresh)

    def remove(self, key: str) -> int:
        self._last.pop(key, None)
        kind = self._kind.pop(key, None) if key in self._nodes else None
        if kind is not None:
            self._count(kind, 0)  # gone unused since it entered its class (a later return counts as a reuse too)
            self._ghost_kind[key] = kind
            while len(self._ghost_kind) > self.ghost_ratio * len(self._nodes) + 64:
                self._ghost_kind.popitem(last=False)
        return super().remove(key)
