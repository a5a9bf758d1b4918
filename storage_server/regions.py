"""Registered client memory regions and the capabilities that let the server write into them.

A client on the same host creates a shared-memory file, writes a random nonce
at its start and registers ``(name, size, nonce)``. The server maps the file
and checks the nonce, which proves the registering tenant can write the
segment (another tenant cannot point the server at memory it does not own).
Registration returns a region id and a secret token; a ``kv-get`` must present
both, and may only target ``[offset, offset+length)`` inside the region, and
only for the tenant that registered it.

A client that crashes never unregisters, so a region that has carried no
transfer for ``idle_s`` seconds is dropped (:meth:`RegionRegistry.expire`),
and a tenant at its region cap loses its least recently used idle region
rather than being refused. The SDK re-registers when told ``KVNoSuchRegion``.
"""

from __future__ import annotations

import hmac
import mmap
import os
import secrets
import time
from dataclasses import dataclass, field

from protocol.errors import ErrorCode, S3Error
from protocol.shm import NONCE_BYTES, SHM_DIR, SHM_NAME
from protocol.wire import REGION_ID_BYTES, TOKEN_BYTES


@dataclass
class Region:
    region_id: bytes
    token: bytes
    tenant: str
    name: str
    size: int
    mm: mmap.mmap
    view: memoryview = field(init=False)
    in_use: int = 0
    last_used: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.view = memoryview(self.mm)

    def hold(self) -> None:
        """A transfer writes into the region: it cannot expire or be dropped meanwhile."""
        self.in_use += 1

    def release(self) -> None:
        self.in_use -= 1
        self.last_used = time.monotonic()  # idle time counts from the end of the last transfer

    def close(self) -> None:
        self.view.release()
        self.mm.close()


class RegionRegistry:
    def __init__(self, max_regions_per_tenant: int = 64) -> None:
        self._regions: dict[bytes, Region] = {}
        self.max_per_tenant = max_regions_per_tenant

    def _drop(self, region: Region) -> None:
        del self._regions[region.region_id]
        region.close()

    def register(self, tenant: str, name: str, size: int, nonce: bytes) -> Region:
        if not SHM_NAME.match(name):
            raise S3Error(ErrorCode.InvalidArgument, f"shm name {name!r} is not a plain /dev/shm file name", extra={"ArgumentName": "name"})
        if size < NONCE_BYTES:
            raise S3Error(ErrorCode.InvalidArgument, f"region size {size} is too small", extra={"ArgumentName": "size"})
        mine = [r for r in self._regions.values() if r.tenant == tenant]
        if len(mine) >= self.max_per_tenant:
            idle = [r for r in mine if not r.in_use]
            if not idle:
                raise S3Error(ErrorCode.ServiceUnavailable, f"tenant {tenant!r} has {self.max_per_tenant} registered regions, all in use")
            self._drop(min(idle, key=lambda r: r.last_used))
        path = SHM_DIR / name
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as e:
            raise S3Error(ErrorCode.InvalidArgument, f"cannot open shared memory {name!r}: {e.strerror}", extra={"ArgumentName": "name"}) from None
        try:
            actual = os.fstat(fd).st_size
            if actual < size:
                raise S3Error(ErrorCode.InvalidArgument, f"shared memory {name!r} is {actual} bytes, not {size}", extra={"ArgumentName": "size"})
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        if not hmac.compare_digest(mm[:NONCE_BYTES], nonce):
            mm.close()
            raise S3Error(ErrorCode.AccessDenied, "registration nonce does not match the region's first bytes")
        region = Region(secrets.token_bytes(REGION_ID_BYTES), secrets.token_bytes(TOKEN_BYTES), tenant, name, size, mm)
        self._regions[region.region_id] = region
        return region

    def resolve(self, tenant: str, region_id: bytes, token: bytes, offset: int, length: int) -> Region:
        """The region a capability names, if it is the caller's and the range fits."""
        region = self._regions.get(region_id)
        if region is None:
            raise S3Error(ErrorCode.KVNoSuchRegion, extra={"Field": "target.region_id"})
        if region.tenant != tenant or not hmac.compare_digest(region.token, token):
            raise S3Error(ErrorCode.AccessDenied, "the capability does not grant access to this region", extra={"Field": "target.token"})
        if offset < 0 or length < 0 or offset + length > region.size:
            raise S3Error(
                ErrorCode.KVTargetTooSmall,
                f"target [{offset}, {offset + length}) is outside the registered region of {region.size} bytes",
                extra={"Field": "target.offset"},
            )
        region.last_used = time.monotonic()
        return region

    def unregister(self, tenant: str, region_id: bytes, token: bytes) -> None:
        region = self.resolve(tenant, region_id, token, 0, 0)
        if region.in_use:
            raise S3Error(ErrorCode.InvalidRequest, "region has transfers in flight")
        self._drop(region)

    def expire(self, idle_s: float, now: float | None = None) -> int:
        """Drop regions that have carried no transfer for ``idle_s`` seconds; returns how many."""
        now = time.monotonic() if now is None else now
        stale = [r for r in self._regions.values() if not r.in_use and now - r.last_used > idle_s]
        for r in stale:
            self._drop(r)
        return len(stale)

    def close(self) -> None:
        for r in self._regions.values():
            if not r.in_use:
                r.close()
        self._regions.clear()

    def __len__(self) -> int:
        return len(self._regions)
