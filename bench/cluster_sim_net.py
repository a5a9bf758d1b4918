"""The cluster simulator's engine: a discrete-event clock and a flow-level fabric with max-min fair sharing.

Flows cross lists of links; whenever a flow starts or ends, or a link's capacity
changes (background load), every flow's rate is recomputed by progressive
filling: the most constrained link fixes the rate of its flows, its capacity is
taken out of the others, and so on. A flow may carry its own rate cap (a
per-port speed; it acts as a private link). Flows with the same links and cap
are grouped, so a recomputation costs O(groups × links), not O(flows × links).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

EPS_BYTES = 1e-9  # a flow with this little left is done (else it finishes when its time left is under 1 ns)


class Fabric:
    """Links by index with capacities (bytes/s); flows share them max-min fairly.

    Flows live in numpy slots (remaining bytes, rate, group); a group is a (links, cap)
    signature whose flows all get the same rate.
    """

    def __init__(self, capacity: list[float]) -> None:
        self.capacity = list(capacity)
        self.busy_bytes = [0.0] * len(capacity)  # bytes carried per link (for utilisation)
        self.now = 0.0
        self.rem = np.zeros(64)
        self.gid = np.full(64, -1)
        self.callbacks: dict[int, Callable[[float], None]] = {}
        self.free: list[int] = list(range(63, -1, -1))
        self.group_of: dict[tuple[tuple[int, ...], float], int] = {}
        self.group_key: list[tuple[tuple[int, ...], float]] = []
        self.group_count: list[int] = []
        self.group_rate = np.zeros(0)
        self.live: set[int] = set()  # groups with flows

    @property
    def flows(self) -> dict[int, Callable[[float], None]]:
        return self.callbacks

    def add(self, now: float, links: tuple[int, ...], nbytes: float, on_done: Callable[[float], None], cap: float = math.inf) -> int:
        self.advance(now)
        if not self.free:
            n = len(self.rem)
            self.rem = np.concatenate([self.rem, np.zeros(n)])
            self.gid = np.concatenate([self.gid, np.full(n, -1)])
            self.free = list(range(2 * n - 1, n - 1, -1))
        slot = self.free.pop()
        key = (tuple(links), cap)
        g = self.group_of.get(key)
        if g is None:
            g = self.group_of[key] = len(self.group_key)
            self.group_key.append(key)
            self.group_count.append(0)
            self.group_rate = np.append(self.group_rate, 0.0)
        self.group_count[g] += 1
        self.live.add(g)
        self.rem[slot], self.gid[slot] = max(nbytes, 0.0), g
        self.callbacks[slot] = on_done
        self._rerate()
        return slot

    def set_capacity(self, now: float, link: int, capacity: float) -> None:
        self.advance(now)
        self.capacity[link] = capacity
        self._rerate()

    def remaining_on(self, link: int) -> list[float]:
        """Remaining bytes of every flow crossing ``link`` (what a node knows of its own transfers)."""
        groups = [g for g in self.live if link in self.group_key[g][0]]
        if not groups:
            return []
        return self.rem[np.isin(self.gid, groups)].tolist()

    def remaining_by_link(self) -> dict[int, list[float]]:
        """Every link's flows' remaining bytes, in one pass."""
        out: dict[int, list[float]] = {}
        for slot in np.flatnonzero(self._active()).tolist():
            for link in self.group_key[self.gid[slot]][0]:
                out.setdefault(link, []).append(float(self.rem[slot]))
        return out

    def queued_on(self, link: int) -> float:
        return float(sum(self.remaining_on(link)))

    def _active(self) -> np.ndarray:
        return self.gid >= 0

    def advance(self, now: float) -> None:
        dt = now - self.now
        if dt > 0 and self.callbacks:
            active = self._active()
            rates = self.group_rate[self.gid[active]]
            self.rem[active] = np.maximum(self.rem[active] - rates * dt, 0.0)
            for g in self.live:
                rate = float(self.group_rate[g])
                if rate < math.inf:
                    moved = rate * self.group_count[g] * dt
                    for link in self.group_key[g][0]:
                        self.busy_bytes[link] += moved
        self.now = max(self.now, now)

    def next_completion(self) -> float:
        if not self.callbacks:
            return math.inf
        active = self._active()
        rates = self.group_rate[self.gid[active]]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(rates > 0, self.rem[active] / rates, np.where(self.rem[active] <= EPS_BYTES, 0.0, math.inf))
        return self.now + float(t.min())

    def complete_due(self, now: float) -> None:
        """Advance to ``now`` and finish every flow with nothing left (their callbacks may start new flows)."""
        self.advance(now)
        active = np.flatnonzero(self._active())
        rates = self.group_rate[self.gid[active]]
        with np.errstate(divide="ignore", invalid="ignore"):
            due = active[(self.rem[active] <= EPS_BYTES) | ((rates > 0) & (self.rem[active] / rates < 1e-9))]
        callbacks = []
        for slot in due.tolist():
            g = int(self.gid[slot])
            for link in self.group_key[g][0]:  # a flow finishes with up to EPS_BYTES left: they were carried too
                self.busy_bytes[link] += float(self.rem[slot])
            self.rem[slot] = 0.0
            self.group_count[g] -= 1
            if not self.group_count[g]:
                self.live.discard(g)
            self.gid[slot] = -1
            self.free.append(slot)
            callbacks.append(self.callbacks.pop(slot))
        if callbacks:
            self._rerate()
        for cb in callbacks:
            cb(now)

    def _rerate(self) -> None:
        live = self.live
        left: dict[int, float] = {}
        users: dict[int, int] = {}
        on_link: dict[int, list[int]] = {}
        capped = []
        for g in live:
            links, cap = self.group_key[g]
            count = self.group_count[g]
            for link in links:
                if link not in left:
                    left[link], users[link], on_link[link] = self.capacity[link], 0, []
                users[link] += count
                on_link[link].append(g)
            if cap < math.inf:
                capped.append((cap, g))
        capped.sort(reverse=True)
        pending = set(live)
        while pending:
            # The tightest constraint: a link's equal share, or a group's own cap.
            share, link = min(((left[lk] / n, lk) for lk, n in users.items() if n > 0), default=(math.inf, -1))
            while capped and capped[-1][1] not in pending:
                capped.pop()
            if capped and capped[-1][0] < share:
                cap, g = capped.pop()
                fixed = [(g, cap)]
            elif link >= 0:
                fixed = [(g, share) for g in on_link[link] if g in pending]
            else:  # only unconstrained flows are left (no links, no cap): they finish at once
                fixed = [(g, math.inf) for g in pending]
            for g, rate in fixed:
                pending.discard(g)
                rate = max(rate, 0.0)
                self.group_rate[g] = rate
                count = self.group_count[g]
                for lk in self.group_key[g][0]:
                    left[lk] -= rate * count
                    users[lk] -= count


@dataclass(order=True)
class _Event:
    time: float
    seq: int
    action: Callable[[float], None] = field(compare=False)


@dataclass
class Clock:
    """Timed callbacks interleaved with the fabric's flow completions."""

    fabric: Fabric
    _heap: list[_Event] = field(default_factory=list)
    _seq: itertools.count = field(default_factory=itertools.count)

    def at(self, time: float, action: Callable[[float], None]) -> None:
        heapq.heappush(self._heap, _Event(time, next(self._seq), action))

    def run(self, until: float = math.inf) -> float:
        """Process events in time order until none are left (or ``until``); returns the last time."""
        now = 0.0
        while True:
            t_event = self._heap[0].time if self._heap else math.inf
            t_flow = self.fabric.next_completion()
            now = min(t_event, t_flow)
            if now == math.inf or now > until:
                return self.fabric.now
            if t_flow <= t_event:
                self.fabric.complete_due(t_flow)
            else:
                ev = heapq.heappop(self._heap)
                self.fabric.advance(ev.time)
                ev.action(ev.time)
