"""``objectcache serve`` keeps both of its processes up: either one that exits is started again.

Each child has its own :class:`~.restart.RestartBackoff`: a crash after a healthy run costs a
short delay, a crash loop backs off, and neither child's restart waits for the other's. The
storage server's crash leaves plain S3 working (KV requests get 503 meanwhile); the gateway's
leaves the storage server, its chunk store and its registered regions as they were, and the
gateway comes back on the port it first listened on. A restart that does not reach READY
counts as one more crash.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .restart import RestartBackoff

Spawn = Callable[[], subprocess.Popen]
# Waits for a spawned child's READY line and returns what it announced; SystemExit if it exited first.
Ready = Callable[[subprocess.Popen], str]


@dataclass
class Supervised:
    """One child of ``serve``: how to start it and when it is due to start again."""

    label: str  # "storage server", "gateway"
    meanwhile: str  # what keeps working while it is down
    spawn: Spawn
    ready: Ready
    proc: subprocess.Popen | None = None
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    started: float = 0.0
    due: float | None = None  # when the next start is due (it has exited)

    def launch(self) -> str:
        """The first start (its failure is serve's)."""
        self.started = time.monotonic()
        self.proc = self.spawn()  # known before it is ready, so a stop while it starts stops it
        return self.ready(self.proc)

    def tend(self, now: float, say: Callable[[str], None]) -> None:
        """Notice an exit and schedule the restart; restart once due."""
        if self.due is None:
            if self.proc is None or self.proc.poll() is None:
                return
            self._schedule(now, f"exited with {self.proc.returncode}", say)
            return
        if now < self.due:
            return
        self.due = None
        self.started = time.monotonic()
        self.proc = self.spawn()
        try:
            self.ready(self.proc)
        except SystemExit as e:  # counted as a crash right after starting: the delay grows
            self._schedule(time.monotonic(), f"did not start ({e.code})", say)
            return
        say(f"objectcache: {self.label} is back")

    def _schedule(self, now: float, what: str, say: Callable[[str], None]) -> None:
        delay = self.backoff.delay_after_crash(now - self.started)
        self.due = now + delay
        say(f"objectcache: {self.label} {what}; restarting in {delay:.1f}s ({self.meanwhile})")
