"""Offline cache replay of a Mooncake-format trace: the node's own policy objects, and the Belady bound.

Each request's ``hash_ids`` are 512-token blocks (equal ids = shared prefix). A request
hits its longest cached leading run (those blocks are pinned and touched as one chain,
as a kv-get does), then stores what it missed as a kv-put does (head last), evicting what
the policy picks (never a block of the request itself). Belady evicts the block whose next use lies farthest in
the future (it knows the trace); it is the offline bound the policies are measured
against. Pure and in memory: a public trace replays in seconds.
"""

from __future__ import annotations

import heapq
import json
import random
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from storage_server.store.cache.pins import PinCounts
from storage_server.store.cache.policy import EvictionPolicy, make_policy

BLOCK_TOKENS = 512
NEVER = float("inf")


@dataclass(frozen=True)
class Request:
    input_length: int
    blocks: tuple[int, ...]


def load(path: Path) -> list[Request]:
    out = []
    with open(path) as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            r = json.loads(line)
            for name in ("input_length", "hash_ids"):
                if name not in r:
                    raise ValueError(f"{path}:{i + 1}: missing {name!r}")
            out.append(Request(int(r["input_length"]), tuple(r["hash_ids"])))
    return out


def working_set(trace: list[Request]) -> int:
    """Distinct blocks the trace touches."""
    return len({b for r in trace for b in r.blocks})


class BeladyPolicy(PinCounts):
    """The offline optimum's choice: the unpinned block used farthest in the future goes first; among blocks next used
    by the same request (a chain), the deepest first, since a lookup only counts a chain's leading blocks."""

    def __init__(self) -> None:
        self._sizes: dict[str, int] = {}
        self._next: dict[str, float] = {}
        self._pins: dict[str, int] = {}
        self._depth: dict[str, int] = {}
        self._heap: list[tuple[float, int, str]] = []  # (-next use, -depth, key); stale entries skipped
        self.used = 0

    def __contains__(self, key: str) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def size(self, key: str) -> int | None:
        return self._sizes.get(key)

    def next_use(self, key: str, when: float, depth: int) -> None:
        self._next[key], self._depth[key] = when, depth
        if key in self._sizes:
            heapq.heappush(self._heap, (-when, -depth, key))

    def add_chain(self, items: list[tuple[str, int]], parent: str | None = None, tenant: str = "") -> None:
        for key, size in items:
            self.add(key, size)

    def tenant_used(self, tenant: str) -> int:
        return 0

    def tenant_of(self, key: str) -> str:
        return ""

    def add(self, key: str, size: int, parent: str | None = None, tenant: str = "") -> None:
        self.remove(key)
        self._sizes[key] = size
        self.used += size
        heapq.heappush(self._heap, (-self._next.get(key, NEVER), -self._depth.get(key, 0), key))

    def touch_chain(self, keys: Iterable[str], fresh: Collection[str] = ()) -> None:
        pass

    @property
    def pinned_bytes(self) -> int:
        return sum(self._sizes.get(k, 0) for k in self._pins)

    def remove(self, key: str) -> int:
        size = self._sizes.pop(key, 0)
        self.used -= size
        return size

    def victims(self, need: int, partial: bool = False, tenant: str | None = None) -> list[str] | None:
        out: list[str] = []
        back: list[tuple[float, int, str]] = []
        chosen: set[str] = set()
        freed = 0
        while freed < need and self._heap:
            entry = heapq.heappop(self._heap)
            neg, _, key = entry
            if key not in self._sizes or -neg != self._next.get(key, NEVER) or key in chosen:
                continue
            back.append(entry)
            chosen.add(key)
            if key in self._pins:
                continue
            out.append(key)
            freed += self._sizes[key]
        for entry in back:
            heapq.heappush(self._heap, entry)
        if len(self._heap) > 4 * len(self._sizes) + 64:  # drop stale entries
            self._heap = [e for e in self._heap if e[2] in self._sizes and -e[0] == self._next.get(e[2], NEVER)]
            heapq.heapify(self._heap)
        return out if freed >= need or partial else None


def _next_uses(trace: list[Request]) -> list[list[float]]:
    """For request i and its block j, the index of the next request that uses that block (inf: none)."""
    later: dict[int, float] = {}
    out: list[list[float]] = [[]] * len(trace)
    for i in range(len(trace) - 1, -1, -1):
        blocks = trace[i].blocks
        out[i] = [later.get(b, NEVER) for b in blocks]
        for b in blocks:
            later[b] = i
    return out


def _runs(positions: list[int]) -> list[list[int]]:
    """Consecutive positions grouped: each group is one chain below the block before it."""
    out: list[list[int]] = []
    for j in positions:
        if out and out[-1][-1] == j - 1:
            out[-1].append(j)
        else:
            out.append([j])
    return out


@dataclass(frozen=True)
class Replay:
    policy: str
    cache_fraction: float
    capacity_blocks: int
    token_hit_ratio: float
    hit_tokens: int
    missed_tokens: int
    evictions: int


def replay(trace: list[Request], policy_name: str, fraction: float, policy: EvictionPolicy | None = None) -> Replay:
    """Run ``trace`` through a cache of ``fraction`` of its working set (in blocks)."""
    capacity = max(1, int(fraction * working_set(trace)))
    belady = policy_name == "belady"
    pol: EvictionPolicy = policy if policy is not None else (BeladyPolicy() if belady else make_policy(policy_name))
    nexts = _next_uses(trace) if belady else None
    hit_tokens = total = evictions = 0
    for i, req in enumerate(trace):
        keys = [str(b) for b in req.blocks]
        if nexts is not None:
            for depth, (key, when) in enumerate(zip(keys, nexts[i])):
                pol.next_use(key, when, depth)  # type: ignore[attr-defined]
        hit = 0
        while hit < len(keys) and keys[hit] in pol:
            hit += 1
        pol.pin(keys)
        pol.touch_chain(keys[:hit])
        missing = [j for j in range(hit, len(keys)) if keys[j] not in pol]
        need = pol.used + len(missing) - capacity
        victims = (pol.victims(need, partial=True) or []) if need > 0 else []
        for v in victims:
            pol.remove(v)
        evictions += len(victims)
        missing = missing[:capacity - pol.used]  # what does not fit beside the request's own pinned blocks is not stored
        for run in _runs(missing):  # as a kv-put stores them, one chain at a time
            pol.add_chain([(keys[j], 1) for j in run], keys[run[0] - 1] if run[0] else None)
        pol.unpin(keys)
        hit_tokens += min(hit * BLOCK_TOKENS, req.input_length)
        total += req.input_length
    return Replay(policy_name, fraction, capacity, hit_tokens / total if total else 0.0, hit_tokens, total - hit_tokens, evictions)


def synthetic_trace(seed: int, requests: int = 600, roots: int = 6, root_blocks: tuple[int, int] = (4, 24),
                    conversations: int = 60, one_off_share: float = 0.35, turn_blocks: tuple[int, int] = (1, 6),
                    tail_blocks: tuple[int, int] = (8, 80)) -> list[dict]:
    """A Mooncake-format trace of the three shapes: shared system-prompt roots (Zipf popularity),
    multi-turn conversations that extend their own previous prompt, and one-off long tails."""
    rng = random.Random(seed)
    ids = iter(range(10**9))
    root_chains = [[next(ids) for _ in range(rng.randint(*root_blocks))] for _ in range(roots)]
    weights = [1 / (k + 1) for k in range(roots)]
    convs: list[list[int]] = []
    out = []
    t = 0
    for _ in range(requests):
        t += rng.randint(1, 400)
        if rng.random() < one_off_share or not conversations:
            chain = rng.choices(root_chains, weights)[0] + [next(ids) for _ in range(rng.randint(*tail_blocks))]
        else:
            if len(convs) < conversations and (not convs or rng.random() < 0.3):
                convs.append(list(rng.choices(root_chains, weights)[0]))
            k = min(int(rng.paretovariate(1.2)) - 1, len(convs) - 1)  # recent conversations are more active
            conv = convs[len(convs) - 1 - k]
            conv.extend(next(ids) for _ in range(rng.randint(*turn_blocks)))
            chain = list(conv)
        out.append({"timestamp": t, "input_length": len(chain) * BLOCK_TOKENS - rng.randint(0, BLOCK_TOKENS - 1),
                    "output_length": rng.randint(1, 400), "hash_ids": chain})
    return out
