"""When ``objectcache serve`` restarts a crashed storage server: soon, unless it keeps crashing.

A storage server that crashes after running healthily is restarted after the
first, short delay; one that crashes again within ``healthy_s`` of starting
waits twice as long as last time (up to ``cap_s``), so a crash loop does not
spin while a single crash costs KV service only a moment.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RestartBackoff:
    first_s: float = 0.5
    cap_s: float = 5.0  # a KV outage per crash stays a few seconds, however often it happens
    healthy_s: float = 3.0
    _next: float = 0.0

    def delay_after_crash(self, uptime_s: float) -> float:
        """The delay before restarting a server that ran for ``uptime_s`` seconds."""
        if uptime_s >= self.healthy_s or self._next == 0.0:
            self._next = self.first_s
        delay = self._next
        self._next = min(self._next * 2, self.cap_s)
        return delay
