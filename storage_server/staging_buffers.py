"""Staging buffers kept between http transfers, per tenant, so a kv-get does not fault its staging in afresh.

An http kv-get stages each piece of a layer in this server before it is sent (two page-aligned
buffers in rotation, :mod:`storage_server.transports.http`). Made new for every kv-get, their first
touch was page faults: profile of back-to-back G64x64 http kv-gets (server timeline), layer 0's
read of 1 MiB took 1.1 ms and layer 1's 1.2 ms, against 0.36 ms for each later layer, which
reuses the same two buffers.

Kept buffers are reused only by the same tenant (a buffer holds what it last staged, and no tenant
may be handed memory with another's bytes in it), only when nothing queued for the socket still
refers to them (a transfer that ended with data unsent drops its buffers), and within
``max_idle_bytes`` all together (the least recently returned go first; at most
``storage_server.http_staging_bytes``). Sizes are rounded up to a
whole MiB so that kv-gets of nearby shapes share them.
"""

from __future__ import annotations

import mmap
from collections import OrderedDict

ROUND = 1 << 20
MAX_IDLE_BYTES = 64 << 20  # idle staging kept resident, all tenants together (two buffers of up to 8 MiB per kv-get)


def rounded(nbytes: int) -> int:
    return max(ROUND, -(-nbytes // ROUND) * ROUND)


class StagingBuffers:
    """Idle page-aligned buffers by (tenant, size), least recently returned first out."""

    def __init__(self, max_idle_bytes: int = MAX_IDLE_BYTES) -> None:
        self.max_idle_bytes = max_idle_bytes
        self._idle: OrderedDict[int, tuple[str, mmap.mmap]] = OrderedDict()  # id(buffer) -> (tenant, buffer)
        self.idle_bytes = 0
        self.reused = self.made = 0

    def take(self, tenant: str, nbytes: int) -> mmap.mmap:
        """A buffer of at least ``nbytes`` that only ``tenant`` has used (or a new one)."""
        size = rounded(nbytes)
        for key, (owner, buf) in self._idle.items():
            if owner == tenant and len(buf) == size:
                del self._idle[key]
                self.idle_bytes -= size
                self.reused += 1
                return buf
        self.made += 1
        return mmap.mmap(-1, size)

    def give(self, tenant: str, buf: mmap.mmap) -> None:
        """``buf`` is free again (nothing queued refers to it); kept if it fits, oldest dropped to make room."""
        if len(buf) > self.max_idle_bytes:
            return
        while self.idle_bytes + len(buf) > self.max_idle_bytes:
            _, (_, old) = self._idle.popitem(last=False)
            self.idle_bytes -= len(old)  # dropped, not closed: an exported view may still name it (unmapped with the last)
        self._idle[id(buf)] = (tenant, buf)
        self.idle_bytes += len(buf)

    def status(self) -> dict[str, int]:
        return {"idle_bytes": self.idle_bytes, "idle": len(self._idle), "reused": self.reused, "made": self.made}
