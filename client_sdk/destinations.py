"""Where a fetch's payload lands, one kind per transport: the client side of the transport registry.

A destination gives the descriptor its ``target`` and the SDK the memory the
layers appear in. ``shm`` lends a registered shared-memory region (the server
writes into it); ``http`` is ordinary memory the SDK fills from DATA frames.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocol.rdma_token import RdmaToken
from protocol.wire import Target, TransportKind

from .buffers import RegionPool, RegisteredRegion, ShmRegion


@dataclass
class Destination:
    """One fetch's memory and the descriptor target naming it."""

    target: Target
    view: memoryview
    region: RegisteredRegion | None = None  # shm: the region lent to this fetch
    rdma: Any = None  # rdma: the registered buffer lent to this fetch


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
    kind = TransportKind.HTTP
    verify_by_default = True

    async def acquire(self, payload_bytes: int, out: memoryview | np.ndarray | None) -> Destination:
        view = memoryview(out).cast("B")[:payload_bytes] if out is not None else memoryview(bytearray(payload_bytes))
        if view.nbytes < payload_bytes:
            raise ValueError(f"out has {view.nbytes} bytes; the payload needs {payload_bytes}")
        return Destination(Target(TransportKind.HTTP, offset=0, length=payload_bytes), view)


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

    def forget(self, dest: Destination) -> None:
        if dest.region is not None:
            self.pool.forget(dest.region)
            dest.region = None

    def forget_idle(self) -> None:
        self.pool.forget_idle()

    def close(self) -> list[RegisteredRegion]:
        return self.pool.close()
