"""Evict the leaf least likely to be used again, with the odds learnt online per kind of chunk (pure, no I/O, no clock).

Why learnt and not a fixed worth: on the public Mooncake conversation trace the fixed
"hits + lineage" worth of :mod:`.prefix_tree` falls below LRU (67% vs 76% of Belady's hits
at a 10% cache): there, a conversation that continued once is no likelier to continue
again (≈30% either way), so rewarding hits keeps dead conversations. An LRU that knew
which chunks are never used again would match Belady on that trace, so the gap is all in
*predicting reuse*; what the traces let a node predict differs between them (a shared
root's reuse on one, the partial last chunk of a prompt that the next turn replaces on
all: <2% reused), so the policy counts, per class of chunk, how many entered it and how
many were used again, and ages a chunk by how unlikely its class makes a reuse:

    priority = clock at last use + used bytes × ln p̂(class)      (evict the lowest leaf first)

With equal odds this is the prefix tree's LRU (tails before heads). Classes: a new chunk by
where it hangs (no parent / below a root / deeper) and whether it ends its stored chain;
a chunk asked for again after its eviction (ghost list); a chunk hit n times (n ≤ 3).
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
# Cache turnovers (in units of the bytes cached) a chunk is aged per e-fold drop of its reuse odds.
HORIZON = 1.0


class ReusePolicy(PrefixTreePolicy):
    def __init__(self, horizon: float = HORIZON) -> None:
        super().__init__()
        self.horizon = horizon
        self._odds: dict[Kind, list[float]] = {}  # class -> [evicted unused, used again]
        self._all = [0.0, 0.0]  # every class: [evicted unused, used again]
        self._high = 1
        self._kind: dict[str, Kind] = {}
        self._ghost_kind: OrderedDict[str, Kind] = OrderedDict()

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
        # In units of the most ever cached (the cache's size once full: a chunk priced while the cache
        # filled up must not outlive later ones), relative to the odds of all chunks (an average one is LRU).
        # Until MIN_REUSES reuses were seen, plain recency: with none seen, every class's odds only say how
        # many chunks it has (fewer look better), which evicted the bulk of new chains first.
        self._high = max(self._high, self.used)
        shift = 0.0
        if self._all[1] >= MIN_REUSES:
            shift = math.log(self.odds(kind if kind is not None else ("unknown",)) / self.overall())
        node.prio = self.clock + self.horizon * self._high * shift
        if not node.children:
            heapq.heappush(self._heap, (node.prio, next(self._seq), key))

    def add(self, key: str, size: int, parent: str | None = None, tenant: str = "") -> None:
        self.remove(key)
        self._classify(key, parent, False)
        super().add(key, size, parent, tenant)

    def _classify(self, key: str, parent: str | None, chain_end: bool) -> None:
        ghost = self._ghost_kind.pop(key, None)
        if ghost is not None:  # stored, evicted, asked for again: its old class was right to expect a reuse
            self._count(ghost, 1)
            self._kind[key] = ("again",)
            return
        up = self._nodes.get(parent) if parent is not None else None
        where = "head" if parent is None else "orphan" if up is None else "below-root" if up.depth == 0 else "deeper"
        self._kind[key] = ("new", where, "end" if chain_end else "body")

    def add_chain(self, items: list[tuple[str, int]], parent: str | None = None, tenant: str = "") -> None:
        for i, (key, size) in enumerate(items):
            self.remove(key)
            self._classify(key, parent, i == len(items) - 1)
            PrefixTreePolicy.add(self, key, size, parent, tenant)
            parent = key

    def touch_chain(self, keys) -> None:  # type: ignore[no-untyped-def]
        keys = list(keys)
        for key in keys:
            if key in self._nodes:
                kind = self._kind.get(key)
                self._count(kind, 1)
                hits = int(kind[1]) + 1 if kind is not None and kind[0] == "hit" else 1
                self._kind[key] = ("hit", str(min(hits, 3)))
        super().touch_chain(keys)

    def remove(self, key: str) -> int:
        kind = self._kind.pop(key, None) if key in self._nodes else None
        if kind is not None:
            self._count(kind, 0)  # gone unused since it entered its class (a later return counts as a reuse too)
            self._ghost_kind[key] = kind
            while len(self._ghost_kind) > self.ghost_ratio * len(self._nodes) + 64:
                self._ghost_kind.popitem(last=False)
        return super().remove(key)
