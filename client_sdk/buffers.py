"""Client memory the storage server writes into.

``ShmRegion`` is a sealed memfd mapped into this process: it has no name, so
nobody else can find it, and it can never shrink, so the storage server's
mapping of it can never fault. After it is handed over (:mod:`protocol.shm`),
the storage server on the same host maps the same pages and reads chunk slices
straight into them. The memory goes back to the system when the last mapping
does, even if this process crashes. Regions are registered once and reused;
``RegionPool`` hands one to each concurrent fetch.
"""

from __future__ import annotations

import asyncio
import fcntl
import mmap
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocol.errors import ErrorCode, S3Error
from protocol.rpc import decode_reply
from protocol.shm import REQUIRED_SEALS, populate

PAGE = mmap.PAGESIZE


def host_memory(out: Any, nbytes: int) -> np.ndarray:
    """``out`` as writable, contiguous uint8 host memory of at least ``nbytes`` (no copy).

    Any buffer-protocol object (numpy array, bytearray, mmap, memoryview) or a CPU torch tensor;
    the array keeps ``out`` alive while it is registered.
    """
    if type(out).__module__.split(".")[0] == "torch":
        import torch

        if out.device.type != "cpu":
            raise ValueError(f"out is a {out.device.type} tensor: the SDK registers host memory only (GPU memory is not supported yet)")
        if not out.is_contiguous():
            raise ValueError("out must be a contiguous tensor")
        out = out.reshape(-1).view(torch.uint8).numpy()
    try:
        view = memoryview(out)
    except TypeError:
        raise ValueError(f"out must support the buffer protocol (numpy, bytearray, mmap, a CPU tensor), not {type(out).__name__}") from None
    if view.readonly or not view.c_contiguous:
        raise ValueError("out must be writable, C-contiguous memory")
    arr = np.frombuffer(view.cast("B"), np.uint8)
    if arr.nbytes < nbytes:
        raise ValueError(f"out has {arr.nbytes} bytes; the payload needs {nbytes}")
    return arr


class ShmRegion:
    """A sealed memfd of ``size`` bytes, mapped here; ``fd`` is kept until the hand-over (:meth:`handed_over`)."""

    def __init__(self, size: int, prefault: bool = False) -> None:
        self.size = max(size, PAGE)
        # Faulted in here at creation; the storage server is asked to fault in its mapping too.
        self.prefaulted = prefault
        self.fd: int | None = os.memfd_create("objectcache-kv", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, self.size)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, REQUIRED_SEALS)
            self.mm = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            if prefault:
                populate(self.mm, self.size)
        except BaseException:
            os.close(self.fd)
            raise
        self.view = memoryview(self.mm)

    def handed_over(self) -> None:
        """The server has mapped the memory (or refused it): this process needs only its own mapping."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def close(self) -> None:
        self.handed_over()
        self.view.release()
        try:
            self.mm.close()
        except BufferError:
            pass  # a caller still holds a view; the mapping goes with the process


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

    async def acquire(self, nbytes: int, prefault: bool = False) -> RegisteredRegion:
        """A free registered region of at least ``nbytes``, creating one if none fits.

        ``prefault`` (what :meth:`ObjectCacheClient.warm_up` asks for) creates a new
        region in a worker thread and faults in all its pages there, and has the
        storage server do the same with its mapping: off the event loop and off any
        later fetch's critical path.
        """
        async with self._lock:
            fits = [r for r in self._regions if not r.busy and r.region.size >= nbytes]
            if fits:
                r = min(fits, key=lambda r: r.region.size)
            else:
                size = max(nbytes, self.min_size)
                size = -(-size // PAGE) * PAGE
                region = await asyncio.to_thread(ShmRegion, size, True) if prefault else ShmRegion(size)
                try:
                    region_id, token = await self._register(region)
                except BaseException:
                    region.close()
                    raise
                finally:
                    region.handed_over()
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


def hand_over(socket_path: str, ticket: bytes, fd: int, timeout: float = 10.0) -> dict:
    """Step 2 of a registration: give the storage server the memfd with its ticket; the reply's fields."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(socket_path)
        except OSError as e:
            raise S3Error(ErrorCode.ServiceUnavailable, f"cannot reach the storage server's shm hand-over socket ({e.strerror}): "
                          "shm needs the storage server on this host; use transport='http'") from None
        socket.send_fds(s, [ticket], [fd])
        with s.makefile("rb") as f:
            line = f.readline()
    if not line:
        raise S3Error(ErrorCode.ServiceUnavailable, "the storage server closed the shm hand-over without answering")
    return decode_reply(line)
