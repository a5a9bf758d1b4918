"""Client memory the storage server writes into.

``ShmRegion`` is a ``/dev/shm`` file mapped into this process; after it is
registered, the storage server (on the same host) maps the same pages and
reads chunk slices straight into them. Regions are registered once and
reused; ``RegionPool`` hands one to each concurrent fetch.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from protocol.shm import NONCE_BYTES, SHM_DIR

PAGE = mmap.PAGESIZE


class ShmRegion:
    """A private (0600) shared-memory file.

    Its name is removed as soon as the storage server has mapped it
    (:meth:`unlink`), so the memory goes back to the system when the last
    mapping does, even if this process crashes.
    """

    def __init__(self, size: int) -> None:
        self.size = max(size, NONCE_BYTES)
        self.name = f"objectcache-{os.getpid()}-{secrets.token_hex(8)}"
        self.path = SHM_DIR / self.name
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, self.size)
            self.mm = mmap.mmap(fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.view = memoryview(self.mm)
        self.nonce = secrets.token_bytes(NONCE_BYTES)
        self.mm[:NONCE_BYTES] = self.nonce  # proves to the server that we can write this segment

    def unlink(self) -> None:
        self.path.unlink(missing_ok=True)

    def close(self) -> None:
        self.view.release()
        try:
            self.mm.close()
        except BufferError:
            pass  # a caller still holds a view; the mapping goes with the process
        self.path.unlink(missing_ok=True)


@dataclass
class RegisteredRegion:
    region: ShmRegion
    region_id: bytes
    token: bytes
    busy: bool = field(default=False)


class RegionPool:
    """Registered regions, reused across fetches; one per concurrent fetch."""

    def __init__(self, register: Callable[[ShmRegion], Awaitable[tuple[bytes, bytes]]], min_size: int = 64 << 20) -> None:
        self._register = register
        self._regions: list[RegisteredRegion] = []
        self._lock = asyncio.Lock()
        self.min_size = min_size

    async def acquire(self, nbytes: int) -> RegisteredRegion:
        async with self._lock:
            fits = [r for r in self._regions if not r.busy and r.region.size >= nbytes]
            if fits:
                r = min(fits, key=lambda r: r.region.size)
            else:
                size = max(nbytes, self.min_size)
                size = -(-size // PAGE) * PAGE
                region = ShmRegion(size)
                try:
                    region_id, token = await self._register(region)
                except BaseException:
                    region.close()
                    raise
                finally:
                    region.unlink()  # registered (mapped by the server) or refused: the name is no longer needed
                r = RegisteredRegion(region, region_id, token)
                self._regions.append(r)
            r.busy = True
            return r

    def release(self, r: RegisteredRegion) -> None:
        r.busy = False

    def forget(self, r: RegisteredRegion) -> None:
        """Drop a region the server no longer knows (e.g. it restarted)."""
        if r in self._regions:
            self._regions.remove(r)
        r.region.close()

    def close(self) -> list[RegisteredRegion]:
        regions, self._regions = self._regions, []
        for r in regions:
            r.region.close()
        return regions
