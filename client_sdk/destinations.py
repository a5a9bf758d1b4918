"""Where a fetch's payload lands, one kind per transport: the client side of the transport registry.

A destination gives the descriptor its ``target`` and the SDK the memory the
layers appear in. ``shm`` lends a registered shared-memory region (the server
writes into it); ``http`` is ordinary memory the SDK fills from DATA frames.
"""

from __future__ import annotations

import abc
import mmap
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocol.rdma_token import RdmaToken
from protocol.wire import Target, TransportKind

from .buffers import RegionPool, RegisteredRegion, ShmRegion


def fresh_memory(nbytes: int) -> memoryview:
    """Memory for a payload the caller gave no ``out`` for: anonymous pages, not zero-filled first.

    A ``bytearray`` of a 2 GB payload is written twice (zeroes, then the payload)
    and faulted in 4 KiB at a time: in a profile of a G=16 64K fetch over http
    that allocation was 65% of the client's time. Fresh anonymous pages are
    zero by the kernel's word, faulted in as the payload arrives, and huge
    pages where the kernel allows them (fewer faults).
    """
    if nbytes == 0:
        return memoryview(bytearray())
    m = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass  # no transparent huge pages here: 4 KiB pages then
    return memoryview(m)


@dataclass
class Destination:
    """One fetch's memory and the descriptor target naming it."""

    target: Target
    view: memoryview
    region: RegisteredRegion | None = None  # shm: the region lent to this fetch
    rdma: Any = None  # rdma: the registered buffer lent to this fetch
    pooled: memoryview | None = None  # http: the SDK's own memory lent to this fetch


class Destinations(abc.ABC):
    """Hands out destinations of one transport kind."""

    kind: TransportKind
    # Verify each layer's CRC32C unless the caller says otherwise: where the bytes crossed sockets.
    verify_by_default: bool

    @abc.abstractmethod
    async def acquire(self, payload_bytes: int, out: memoryview | np.ndarray | None) -> Destination: ...

    def layer_waiter(self, dest: Destination, tag: int) -> Callable[[int], Awaitable[None]] | None:
        """What to await before handing out layer ℓ beyond its LAYER frame (rdma over pyverbs: its immediate)."""
        return None

    def token(self, dest: Destination) -> RdmaToken:
        """The ``x-amz-rdma-token`` describing ``dest``'s registered memory (rdma only)."""
        raise ValueError(f"{self.kind.name.lower()} memory has no x-amz-rdma-token: it is for the rdma transport")

    def release(self, dest: Destination) -> None:
        """The fetch is over: the memory may be reused."""

    def abandon(self, dest: Destination) -> list[RegisteredRegion]:
        """The fetch stopped before its end frame, and the storage server may still be writing into ``dest`` (it stops
        at its next layer once it sees the connection closed): never hand that memory to another fetch. Returns the
        registrations (``region_id``, ``token``) to unregister; the node lets go of one once its transfer ends."""
        # http: the SDK's own socket reads fill it, nothing writes once the socket is closed. rdma: one queue pair per
        # buffer executes the abandoned request's writes before any later request's, whose LAYER announcements carry a
        # new tag (the old one's are dropped), so the buffer is reused (NIXL's ordering is not checked here).
        self.release(dest)
        return []

    def forget(self, dest: Destination) -> None:
        """The server no longer knows this destination (it restarted): never reuse it."""

    def forget_idle(self) -> None:
        """The server forgot one of our registrations, most likely by restarting: every idle one is suspect.

        Dropping them all costs one re-registration each when next needed; keeping them would
        make each retry pick another stale one.
        """

    def close(self) -> list[RegisteredRegion]:
        """Free everything; the regions the server should be told to unregister."""
        return []


class BufferDestinations(Destinations):
    """Destinations backed by buffers this client registered with an RDMA engine, reused across fetches.

    Subclasses keep ``self._buffers`` (each with a ``busy`` flag) and say how to free one.
    """

    _buffers: list[Any]

    @abc.abstractmethod
    def _free(self, buffer: Any) -> None:
        """Let go of one buffer's registration."""

    def release(self, dest: Destination) -> None:
        if dest.rdma is not None:
            dest.rdma.busy = False

    def forget(self, dest: Destination) -> None:
        if dest.rdma is not None:
            self._drop(dest.rdma)
            dest.rdma = None

    def forget_idle(self) -> None:
        for b in [b for b in self._buffers if not b.busy]:
            self._drop(b)

    def _drop(self, buffer: Any) -> None:
        if buffer in self._buffers:
            self._buffers.remove(buffer)
            self._free(buffer)

    def close(self) -> list:
        buffers, self._buffers = self._buffers, []
        for b in buffers:
            self._free(b)
        return buffers


class HttpDestinations(Destinations):
    """The caller's ``out``, or memory of the SDK's own, reused by later fetches like shm regions are.

    A fetch's layer views are valid until its ``fetch_layers`` block exits; then
    its memory goes back to the pool. A buffer is reused while it fits, so a
    client holds one per concurrent fetch (of the largest size it needed):
    faulting in fresh pages costs more than the transfer itself at 2 GB.
    """

    kind = TransportKind.HTTP
    verify_by_default = True

    def __init__(self) -> None:
        self._idle: list[memoryview] = []

    async def acquire(self, payload_bytes: int, out: memoryview | np.ndarray | None) -> Destination:
        if out is not None:
            view = memoryview(out).cast("B")[:payload_bytes]
            if view.nbytes < payload_bytes:
                raise ValueError(f"out has {view.nbytes} bytes; the payload needs {payload_bytes}")
            return Destination(Target(TransportKind.HTTP, offset=0, length=payload_bytes), view)
        fits = [b for b in self._idle if b.nbytes >= payload_bytes]
        if fits:
            buffer = min(fits, key=lambda b: b.nbytes)
            self._idle.remove(buffer)
        else:
            self._idle.clear()  # too small for what fetches need now: let them go rather than keep both
            buffer = fresh_memory(payload_bytes)
        return Destination(Target(TransportKind.HTTP, offset=0, length=payload_bytes), buffer[:payload_bytes], pooled=buffer)

    def release(self, dest: Destination) -> None:
        if dest.pooled is not None:  # the SDK's own memory (``out`` is the caller's)
            self._idle.append(dest.pooled)
            dest.pooled = None

    def close(self) -> list[RegisteredRegion]:
        self._idle.clear()
        return []


class ShmDestinations(Destinations):
    kind = TransportKind.SHM
    verify_by_default = False  # the server writes the very pages this process reads

    def __init__(self, register: Callable[[ShmRegion], Awaitable[tuple[bytes, bytes]]]) -> None:
        self.pool = RegionPool(register)

    async def acquire(self, payload_bytes: int, out: memoryview | np.ndarray | None) -> Destination:
        if out is not None:
            raise ValueError("out is for the http and rdma transports; over shm the payload lands in a registered region")
        region = await self.pool.acquire(payload_bytes)
        target = Target(TransportKind.SHM, region.region_id, region.token, 0, payload_bytes)
        return Destination(target, region.region.view[:payload_bytes], region)

    async def warm_up(self, payload_bytes: int, regions: int = 1) -> None:
        """Create, register and pre-fault ``regions`` regions that each fit ``payload_bytes``, ready for later fetches."""
        held = []
        try:
            for _ in range(regions):
                held.append(await self.pool.acquire(payload_bytes, prefault=True))
        finally:
            for r in held:
                self.pool.release(r)

    def release(self, dest: Destination) -> None:
        if dest.region is not None:
            self.pool.release(dest.region)

    def abandon(self, dest: Destination) -> list[RegisteredRegion]:
        # Reused at once, the region took the next fetch's layers while the abandoned transfer's last pieces could still
        # land in it (the server's read threads finish the piece they are copying, and the loop notices the close only
        # at its next turn).
        region, dest.region = dest.region, None
        if region is None:
            return []
        self.pool.forget(region)
        return [region]

    def forget(self, dest: Destination) -> None:
        if dest.region is not None:
            self.pool.forget(dest.region)
            dest.region = None

    def forget_idle(self) -> None:
        self.pool.forget_idle()

    def close(self) -> list[RegisteredRegion]:
        return self.pool.close()
