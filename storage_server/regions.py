"""Registered client memory regions and the capabilities that let the server write into them.

A client on the same host hands over a sealed memfd (:mod:`protocol.shm`): the
tenant asks for a one-time ticket through the signed HTTP API (:meth:`offer`),
then passes the ticket and the descriptor over the hand-over socket
(:meth:`complete`). The server maps exactly that memory, which can never shrink
under it, and never opens memory by name. Registration returns a region id and a
secret token; a ``kv-get`` must present both, may only target
``[offset, offset+length)`` inside the region, and only for the tenant that
registered it.

A client that crashes never unregisters, so a region that has carried no
transfer for ``idle_s`` seconds is dropped (:meth:`RegionRegistry.expire`),
and a tenant at its region cap loses its least recently used idle region
rather than being refused. The SDK re-registers when told ``KVNoSuchRegion``.

Every shm region takes its whole declared size of this process's address space
whatever its residency (a sealed sparse memfd of 16 TiB costs no memory but 16 TiB
of mappings), so declared bytes — mapped regions and pending tickets — are bounded
per tenant and in total (:class:`ShmBudget`): a tenant's own idle regions make room,
other tenants' never do.
"""

from __future__ import annotations

import fcntl
import hmac
import mmap
import os
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from protocol.errors import ErrorCode, S3Error
from protocol.shm import REQUIRED_SEALS, TICKET_BYTES, TICKET_TTL_S
from protocol.wire import REGION_ID_BYTES, TOKEN_BYTES

MAX_PENDING_PER_TENANT = 16
R = TypeVar("R", bound="Region")


@dataclass(frozen=True)
class ShmBudget:
    """Declared bytes of shm regions (mapped or promised by a ticket): per tenant, and all tenants together."""

    per_tenant: int = 1 << 40
    total: int = 1 << 44

    def to_drop(self, tenant: str, size: int, firm: int, idle: "list[Region]", others: int) -> "list[Region]":
        """Which of ``tenant``'s ``idle`` regions (least recently used first) must go so ``size`` more bytes fit,
        given its ``firm`` bytes (regions in use, pending tickets) and ``others`` (every other tenant's);
        refused (naming the limit) when dropping them all is not enough."""
        if size > min(self.per_tenant, self.total):
            raise S3Error(ErrorCode.InvalidArgument, f"an shm region of {size} bytes is more than the storage server allows "
                          f"(storage_server.shm_max_bytes_per_tenant = {self.per_tenant}, storage_server.shm_max_bytes = {self.total})",
                          extra={"ArgumentName": "size"})
        if firm + size > self.per_tenant:
            raise S3Error(ErrorCode.ServiceUnavailable, f"tenant {tenant!r} has {firm} bytes of shm regions in use or pending; "
                          f"{size} more exceed storage_server.shm_max_bytes_per_tenant ({self.per_tenant})")
        if firm + others + size > self.total:
            raise S3Error(ErrorCode.ServiceUnavailable, f"the storage server has {firm + others} bytes of shm regions registered; "
                          f"{size} more exceed storage_server.shm_max_bytes ({self.total}); retry later")
        drop: list[Region] = []
        kept = sum(r.size for r in idle)
        for r in sorted(idle, key=lambda r: r.last_used):
            if firm + kept + size <= self.per_tenant and firm + kept + others + size <= self.total:
                break
            drop.append(r)
            kept -= r.size
        return drop


@dataclass
class Region:
    """Client memory a tenant registered, named by an id and guarded by a secret token."""

    region_id: bytes
    token: bytes
    tenant: str
    size: int
    in_use: int = field(default=0, kw_only=True)
    last_used: float = field(default_factory=time.monotonic, kw_only=True)
    retired: bool = field(default=False, kw_only=True)  # unregistered while in use: no kv-get may name it any more
    # Set on retiring: drops it from its registry at its last release (until then its bytes still count for its tenant).
    when_idle: Callable[[], None] | None = field(default=None, kw_only=True, repr=False)

    def hold(self) -> None:
        """A transfer writes into the region: it cannot expire or be dropped meanwhile."""
        self.in_use += 1

    def release(self) -> None:
        self.in_use -= 1
        self.last_used = time.monotonic()  # idle time counts from the end of the last transfer
        if self.retired and not self.in_use and self.when_idle is not None:
            self.when_idle()

    def close(self) -> None:
        """Let go of the memory."""


@dataclass
class MappedRegion(Region):
    """``shm``: a handed-over memfd, mapped into this process."""

    mm: mmap.mmap
    view: memoryview = field(init=False)
    populate: bool = field(default=False, kw_only=True)  # fault the mapping in at hand-over (RegisterRequest.populate)

    def __post_init__(self) -> None:
        self.view = memoryview(self.mm)

    def close(self) -> None:
        try:
            self.view.release()
            self.mm.close()
        except BufferError:
            # A transfer cut short (its budget ran out, its client left) still has a reader thread holding a slice:
            # unmapping now would pull the memory from under it. The mapping goes when its last view does.
            pass


@dataclass(frozen=True)
class Ticket:
    """A tenant's promise to hand over ``size`` bytes of memory, redeemable once before ``expires``."""

    secret: bytes
    tenant: str
    size: int
    expires: float
    populate: bool = False  # fault in the whole mapping at hand-over (RegisterRequest.populate)


def map_sealed_memfd(fd: int, size: int) -> mmap.mmap:
    """Map ``size`` bytes of a memfd that can never shrink; anything else is refused with a clear error."""
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        seals = 0
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or seals & REQUIRED_SEALS != REQUIRED_SEALS:
        raise S3Error(ErrorCode.InvalidArgument, "the handed-over memory must be a memfd sealed with F_SEAL_SHRINK and F_SEAL_SEAL",
                      extra={"ArgumentName": "fd"})
    if st.st_size < size:
        raise S3Error(ErrorCode.InvalidArgument, f"the handed-over memfd has {st.st_size} bytes, fewer than the {size} registered",
                      extra={"ArgumentName": "size"})
    try:
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, OverflowError, ValueError) as e:  # ENOMEM: no address space (or map count) left for it
        why = e.strerror if isinstance(e, OSError) and e.strerror else e.__class__.__name__
        raise S3Error(ErrorCode.ServiceUnavailable, f"the storage server cannot map a region of {size} bytes now ({why}); "
                      "register a smaller region or retry later", extra={"ArgumentName": "size"}) from None


class RegionRegistry:
    def __init__(self, max_regions_per_tenant: int = 64, populate_max_bytes: int = 32 << 30, shm: ShmBudget = ShmBudget()) -> None:
        self._regions: dict[bytes, Region] = {}
        self._tickets: dict[bytes, Ticket] = {}
        self.max_per_tenant = max_regions_per_tenant
        self.shm = shm
        # Populating faults a tenant's memory in from this process (its pages are charged to the
        # server): bounded per tenant, or one sparse memfd of 64 TiB could exhaust the host.
        self.populate_max_bytes = populate_max_bytes

    def _drop(self, region: Region) -> None:
        del self._regions[region.region_id]
        region.close()

    def offer(self, tenant: str, size: int, now: float | None = None, populate: bool = False) -> Ticket:
        """Step 1 (signed HTTP): a one-time ticket for handing over ``size`` bytes."""
        if not 1 <= size <= 1 << 46:
            raise S3Error(ErrorCode.InvalidArgument, f"region size {size} is out of range", extra={"ArgumentName": "size"})
        now = time.monotonic() if now is None else now
        self._tickets = {k: t for k, t in self._tickets.items() if t.expires > now}
        if sum(t.tenant == tenant for t in self._tickets.values()) >= MAX_PENDING_PER_TENANT:
            raise S3Error(ErrorCode.ServiceUnavailable, f"tenant {tenant!r} has {MAX_PENDING_PER_TENANT} registrations pending; complete them first")
        if populate:
            self._check_populate_budget(tenant, size)
        self.shm.to_drop(tenant, size, *self._shm_claims(tenant))  # refused now if even dropping its idle regions cannot make room
        ticket = Ticket(secrets.token_bytes(TICKET_BYTES), tenant, size, now + TICKET_TTL_S, populate)
        self._tickets[ticket.secret] = ticket
        return ticket

    def _check_populate_budget(self, tenant: str, size: int) -> None:
        held = sum(r.size for r in self._regions.values() if r.tenant == tenant and getattr(r, "populate", False))
        held += sum(t.size for t in self._tickets.values() if t.tenant == tenant and t.populate)
        if held + size > self.populate_max_bytes:
            raise S3Error(
                ErrorCode.InvalidArgument,
                f"populating {size} more bytes would give tenant {tenant!r} {held + size} populated bytes, more than the "
                f"server allows ({self.populate_max_bytes}, storage_server.populate_max_bytes); register without populate "
                "or unregister a populated region first",
                extra={"ArgumentName": "populate"},
            )

    def complete(self, secret: bytes, fd: int, now: float | None = None) -> MappedRegion:
        """Step 2 (hand-over socket): redeem the ticket with the memory itself. ``fd`` stays the caller's to close."""
        now = time.monotonic() if now is None else now
        ticket = self._tickets.pop(secret, None)
        if ticket is None or ticket.expires <= now:
            raise S3Error(ErrorCode.AccessDenied, "the registration ticket is unknown, used or expired; ask for a new one")
        self._tickets = {k: t for k, t in self._tickets.items() if t.expires > now}
        for r in self.shm.to_drop(ticket.tenant, ticket.size, *self._shm_claims(ticket.tenant)):
            self._drop(r)
        self._make_room(ticket.tenant)
        mm = map_sealed_memfd(fd, ticket.size)
        return self.admit(lambda rid, token: MappedRegion(rid, token, ticket.tenant, ticket.size, mm=mm, populate=ticket.populate), ticket.tenant)

    def _shm_claims(self, tenant: str) -> tuple[int, list[Region], int]:
        """Declared shm bytes as :meth:`ShmBudget.to_drop` weighs them: ``tenant``'s that cannot be freed (regions
        in use, pending tickets), its idle mapped regions, and everyone else's bytes."""
        firm = sum(t.size for t in self._tickets.values() if t.tenant == tenant)
        others = sum(t.size for t in self._tickets.values() if t.tenant != tenant)
        idle: list[Region] = []
        for r in self._regions.values():
            if not isinstance(r, MappedRegion):
                continue  # rdma regions are the client's memory, not this process's address space
            if r.tenant != tenant:
                others += r.size
            elif r.in_use:
                firm += r.size
            else:
                idle.append(r)
        return firm, idle, others

    def _make_room(self, tenant: str) -> None:
        """A tenant at its cap loses its least recently used idle region (refused if all are in use)."""
        mine = [r for r in self._regions.values() if r.tenant == tenant]
        if len(mine) >= self.max_per_tenant:
            idle = [r for r in mine if not r.in_use]
            if not idle:
                raise S3Error(ErrorCode.ServiceUnavailable, f"tenant {tenant!r} has {self.max_per_tenant} registered regions, all in use")
            self._drop(min(idle, key=lambda r: r.last_used))

    def admit(self, build: Callable[[bytes, bytes], R], tenant: str) -> R:
        """Add the region ``build(region_id, token)`` makes for ``tenant``, within the tenant's cap."""
        self._make_room(tenant)
        region = build(secrets.token_bytes(REGION_ID_BYTES), secrets.token_bytes(TOKEN_BYTES))
        self._regions[region.region_id] = region
        return region

    def resolve(self, tenant: str, region_id: bytes, token: bytes, offset: int, length: int, kind: type[R] = Region) -> R:  # type: ignore[assignment]
        """The region a capability names, if it is the caller's, of ``kind`` (the transport's) and the range fits."""
        region = self._regions.get(region_id)
        if region is None or not isinstance(region, kind) or region.retired:
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
            # An abandoned fetch's region, its transfer still stopping: no new kv-get can name it from now on, and it is
            # dropped at the transfer's release (refused before, the SDK had no moment it could let go of it). Until
            # then it stays in the table: its bytes still count for the tenant's limits.
            region.retired = True
            region.when_idle = lambda: self._drop(region) if self._regions.get(region.region_id) is region else None
            return
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

    def owned(self, tenant: str, kind: type[R]) -> list[R]:
        """The tenant's regions of ``kind``."""
        return [r for r in self._regions.values() if r.tenant == tenant and isinstance(r, kind)]

    def count(self, tenant: str) -> int:
        return sum(r.tenant == tenant for r in self._regions.values())
