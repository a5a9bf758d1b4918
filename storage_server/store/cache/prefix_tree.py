"""Evict the least valuable *leaf* of the cached prefix trees first: a pure policy (no I/O, no clock).

What LLM prefix traffic looks like (Mooncake traces): a few shared system-prompt roots
that many requests start with, multi-turn conversations whose next turn extends their
own previous prompt, and long one-off tails no one asks for again. LRU treats a block
of a shared root like one of a one-off tail, so a burst of long one-off prompts flushes
the roots. Here each cached chunk is a node of a tree (its parent is the chunk before it
in a chain); only a leaf may go (a lookup counts *leading* chunks, so a head evicted
before its tail leaves the tail dead weight), and the leaf to go is the one of least

    priority = clock at last use + cached bytes × (2·hits + lineage) × (1 + 0.02·depth)

``clock`` counts bytes stored (recency: untouched chunks age out), and the rest is how many
cache turnovers a chunk outlives an unused one of its age: ``hits`` is how many requests'
prefixes used it (an evicted chunk stored again keeps its count through a bounded ghost
list), ``lineage`` how often the chain it *extends* was used when it was stored (the next
turn of a conversation continues its own prefix and is likely to be continued again; a
tail branching off a shared root inherits nothing), and depth the extra attention a deeper
chunk costs to recompute. A stored, never reused chunk (a one-off tail) has worth 0 and
goes first among its age, which acts as the admission rule. The bytes a chunk saves and its
recompute time both grow with its tokens, so per cached byte only the depth term differs.
Pinned chunks (held by a transfer) are never chosen; a pinned leaf does not shield the
unpinned chunks above it. Parents are learnt from stored chains (``add_chain``, or ``add``
with a ``parent`` hint in any order) and from every chain a kv-get touches.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from itertools import count

from .pins import PinCounts

# A chunk at depth d (0 = the head) recomputes attention over d earlier chunks; the
# linear work (projections, MLP) dominates at short contexts, so cost = 1 + d × this.
ATTENTION_SHARE = 0.02
# A chunk's worth in cache turnovers it outlives an unused one: per request its prefix served
# (a hit) and per request the chain it extends served (its lineage: a conversation's next turn).
HIT_WEIGHT = 2.0
LINEAGE_WEIGHT = 1.0
# Evicted keys remembered (with their hits) per cached one, so a chunk asked for again
# after its eviction is known to be reused (ARC's ghost list; metadata only).
GHOSTS = 8


@dataclass(slots=True)
class _Node:
    size: int
    parent: str | None
    depth: int
    tenant: str = ""
    hits: int = 0
    lineage: int = 0  # how many requests the prefix above it served when it was linked
    prio: float = 0.0
    children: set[str] = field(default_factory=set)


class PrefixTreePolicy(PinCounts):
    def __init__(self, hit_weight: float = HIT_WEIGHT, lineage_weight: float = LINEAGE_WEIGHT, attention_share: float = ATTENTION_SHARE,
                 ghosts: int = GHOSTS) -> None:
        self._nodes: dict[str, _Node] = {}
        self._pins: dict[str, int] = {}
        self._heap: list[tuple[float, int, str]] = []  # (prio, seq, key) of leaves; stale entries skipped
        self._seq = count()
        self.clock = 0  # bytes added so far: a logical clock
        self.hit_weight, self.lineage_weight, self.attention_share = hit_weight, lineage_weight, attention_share
        self._ghosts: OrderedDict[str, int] = OrderedDict()  # evicted key -> its hits (oldest first)
        self.ghost_ratio = ghosts
        self._waiting: dict[str, list[str]] = {}  # parent not cached yet -> children added before it (a put's reversed order)
        self._tenant_used: dict[str, int] = {}
        self.used = 0

    def __contains__(self, key: str) -> bool:
        return key in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def size(self, key: str) -> int | None:
        node = self._nodes.get(key)
        return None if node is None else node.size

    def _worth(self, node: _Node) -> float:
        return (self.hit_weight * node.hits + self.lineage_weight * node.lineage) * (1.0 + self.attention_share * node.depth)

    def _reprice(self, key: str, node: _Node) -> None:
        node.prio = self.clock + self.used * self._worth(node)
        if not node.children:
            heapq.heappush(self._heap, (node.prio, next(self._seq), key))

    def _above(self, key: str, start: str) -> bool:
        """Whether ``key`` is ``start`` or one of its ancestors."""
        cur: str | None = start
        while cur is not None:
            if cur == key:
                return True
            cur = self._nodes[cur].parent
        return False

    def _link(self, key: str, node: _Node, parent: str | None) -> None:
        if parent is None or parent not in self._nodes or node.parent is not None:
            return
        if parent == key or (node.children and self._above(key, parent)):
            return  # keys that claim to be their own prefix: never a cycle (only a chunk with children can close one)
        node.parent = parent
        up = self._nodes[parent]
        # Extending a leaf continues that chain (the next turn of a conversation): it inherits how
        # often the chain was used; branching off a shared root inherits nothing.
        node.lineage = 0 if up.children else max(up.hits, up.lineage)
        up.children.add(key)
        node.depth = up.depth + 1

    def add(self, key: str, size: int, parent: str | None = None, tenant: str = "") -> None:
        """A newly stored chunk of ``tenant``, the child of ``parent`` (the chunk before it in its chain; linked once both are cached)."""
        self.remove(key)
        node = _Node(size=size, parent=None, depth=0, tenant=tenant)
        if tenant:
            self._tenant_used[tenant] = self._tenant_used.get(tenant, 0) + size
        self._nodes[key] = node
        seen = self._ghosts.pop(key, None)
        if seen is not None:  # stored before, evicted, and asked for again: it is reused
            node.hits = seen + 1
        self.used += size
        self.clock += size
        if parent is not None and parent not in self._nodes:
            if len(self._waiting) > len(self._nodes) + 64:
                self._waiting.clear()  # hints only: lost ones are learnt again from the next read of the chain
            self._waiting.setdefault(parent, []).append(key)
        self._link(key, node, parent)
        self._reprice(key, node)
        waiting = self._waiting.pop(key, ())
        for child in waiting:
            below = self._nodes.get(child)
            if below is not None:
                self._link(child, below, key)
        if node.parent is not None or waiting:
            self._descend(key)

    def add_chain(self, items: list[tuple[str, int]], parent: str | None = None, tenant: str = "") -> None:
        """Newly stored chunks of one chain, head first, below ``parent`` (cached or not)."""
        for key, size in items:
            self.add(key, size, parent, tenant)
            parent = key

    def _descend(self, key: str) -> None:
        """After ``key`` was linked above chunks stored before it (a put's reversed order): their depth and lineage."""
        stack, seen = [key], {key}
        while stack:
            up = self._nodes[stack.pop()]
            for child in up.children:
                below = self._nodes[child]
                lineage = 0 if len(up.children) > 1 else max(up.hits, up.lineage)
                if child not in seen and (below.depth != up.depth + 1 or below.lineage != lineage):
                    seen.add(child)
                    below.depth, below.lineage = up.depth + 1, lineage
                    self._reprice(child, below)
                    stack.append(child)

    def tenant_used(self, tenant: str) -> int:
        return self._tenant_used.get(tenant, 0)

    def tenant_of(self, key: str) -> str:
        node = self._nodes.get(key)
        return "" if node is None else node.tenant

    def touch_chain(self, keys: Iterable[str], fresh: Collection[str] = ()) -> None:
        """``keys`` in prefix order served one request: each cached one learns its parent, and gains a hit unless the
        request itself just brought it in (``fresh``)."""
        prev: str | None = None
        for key in keys:
            node = self._nodes.get(key)
            if node is not None:
                self._link(key, node, prev)
                if key not in fresh:
                    node.hits += 1
                self._reprice(key, node)
            prev = key

    @property
    def pinned_bytes(self) -> int:
        return sum(n.size for k, n in self._nodes.items() if k in self._pins)

    def remove(self, key: str) -> int:
        """Forget ``key`` (pinned or not); its size, 0 if it was not there. Its children become roots."""
        node = self._nodes.pop(key, None)
        if node is None:
            return 0
        self.used -= node.size
        if node.tenant:
            self._tenant_used[node.tenant] -= node.size
        self._ghosts[key] = node.hits
        while len(self._ghosts) > self.ghost_ratio * len(self._nodes) + 64:
            self._ghosts.popitem(last=False)
        for child in node.children:
            self._nodes[child].parent = None
        if node.parent is not None:
            up = self._nodes[node.parent]
            up.children.discard(key)
            if not up.children:
                heapq.heappush(self._heap, (up.prio, next(self._seq), node.parent))
        return node.size

    def _valid(self, prio: float, key: str) -> bool:
        node = self._nodes.get(key)
        return node is not None and node.prio == prio and not node.children

    def victims(self, need: int, partial: bool = False, tenant: str | None = None) -> list[str] | None:
        """Unpinned leaves (of ``tenant`` only, if given), least valuable first (a parent becomes a leaf once its children are chosen), adding up to ``need``;
        if those are not enough (a pinned tail holds its prefix), other unpinned chunks after them.

        If even all of them are not enough: None, or with ``partial`` all of them. Nothing changes until the caller removes them.
        """
        out: list[str] = []
        freed = 0
        taken: list[tuple[float, int, str]] = []  # popped entries still valid: pushed back
        local: list[tuple[float, int, str]] = []  # parents that become leaves during this selection
        gone: dict[str, int] = {}  # parent -> children chosen
        chosen: set[str] = set()
        while freed < need and (self._heap or local):
            if local and (not self._heap or local[0] < self._heap[0]):
                entry = heapq.heappop(local)
            else:
                entry = heapq.heappop(self._heap)
                if not self._valid(entry[0], entry[2]):
                    continue
                taken.append(entry)
            key = entry[2]
            if key in chosen:
                continue
            chosen.add(key)
            node = self._nodes[key]
            if key not in self._pins and (tenant is None or node.tenant == tenant):
                out.append(key)
                freed += node.size
            # A pinned leaf stays, but does not shield its prefix: the parent becomes a candidate in its turn.
            up = node.parent
            if up is not None:
                gone[up] = gone.get(up, 0) + 1
                parent = self._nodes[up]
                if gone[up] == len(parent.children):
                    heapq.heappush(local, (parent.prio, next(self._seq), up))
        for entry in taken:
            heapq.heappush(self._heap, entry)
        if freed < need:  # only chunks above pinned ones are left: the bound still holds, so they go too, least valuable first
            taken_keys = set(out)
            rest = sorted((n.prio, k) for k, n in self._nodes.items()
                          if k not in taken_keys and k not in self._pins and (tenant is None or n.tenant == tenant))
            for _, key in rest:
                if freed >= need:
                    break
                out.append(key)
                freed += self._nodes[key].size
        if len(self._heap) > 4 * len(self._nodes) + 64:
            self._heap = [e for e in self._heap if self._valid(e[0], e[2])]
            heapq.heapify(self._heap)
        return out if freed >= need or partial else None
