"""Pacing primitives: a per-request token bucket and weighted deficit round robin.

Both are pure (the caller supplies time and does the waiting).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TokenBucket:
    """GCRA form of a token bucket: ``rate`` bytes/s with ``burst`` bytes of credit.

    ``reserve(n, now)`` returns how long to wait before sending ``n`` bytes so
    the long-run rate never exceeds ``rate``.
    """

    rate: float
    burst: float
    _tat: float | None = None  # theoretical arrival time of the next byte

    def wait_s(self, now: float) -> float:
        """How long the next send would wait, without reserving anything (what :meth:`reserve` would return)."""
        if self.rate == float("inf") or self._tat is None:
            return 0.0
        return max(0.0, max(self._tat, now) - now - self.burst / self.rate)

    def reserve(self, nbytes: float, now: float) -> float:
        if self.rate == float("inf"):
            return 0.0
        tat = now if self._tat is None else max(self._tat, now)
        # Credit: we may start up to burst/rate before the theoretical time.
        delay = max(0.0, tat - now - self.burst / self.rate)
        self._tat = tat + nbytes / self.rate
        return delay


@dataclass
class DeficitRoundRobin:
    """Weighted DRR over flows: each visit adds the flow's quantum to its deficit;
    the head item is served when its cost fits. Over time each backlogged flow
    is served in proportion to its quantum."""

    flows: "OrderedDict[str, deque[tuple[float, Any]]]" = field(default_factory=OrderedDict)
    quantum: dict[str, float] = field(default_factory=dict)
    deficit: dict[str, float] = field(default_factory=dict)

    def add_flow(self, flow: str, quantum: float) -> None:
        if quantum <= 0:
            raise ValueError("quantum must be positive")
        self.flows.setdefault(flow, deque())
        self.quantum[flow] = quantum
        self.deficit.setdefault(flow, 0.0)

    def remove_flow(self, flow: str) -> list[Any]:
        items = [item for _, item in self.flows.pop(flow, deque())]
        self.quantum.pop(flow, None)
        self.deficit.pop(flow, None)
        return items

    def enqueue(self, flow: str, cost: float, item: Any) -> None:
        self.flows[flow].append((cost, item))

    def __len__(self) -> int:
        return sum(len(q) for q in self.flows.values())

    def pop(self) -> Any | None:
        """The next item to serve, or None when every flow is empty."""
        if not len(self):
            return None
        while True:
            flow, queue = next(iter(self.flows.items()))
            if queue:
                cost, item = queue[0]
                if cost <= self.deficit[flow]:
                    queue.popleft()
                    self.deficit[flow] -= cost
                    if not queue:
                        self.deficit[flow] = 0.0  # idle flows do not bank credit
                    return item
                self.deficit[flow] += self.quantum[flow]
            else:
                self.deficit[flow] = 0.0
            self.flows.move_to_end(flow)
