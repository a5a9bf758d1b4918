"""The storage server's ``pyverbs`` engine: an RC queue pair per registered client region.

Per registration (``kv-register-rdma`` with engine ``"pyverbs"``) the server creates a queue
pair, connects it to the client's (:class:`~protocol.verbs.QpLink`) and answers its own end.
A kv-get then writes each piece of a layer with RDMA WRITEs — split so no work request has
more than the device's scatter-gather elements or message size, and checked against the
registered ``[addr, addr+size)`` so nothing is ever written outside what the tenant
registered — and announces the layer with a zero-length WRITE_WITH_IMM carrying
``encode_imm(tag, layer)``. Every work request is signaled; one poller per engine drains the
shared completion queue and wakes the writer. A failed completion moves the queue pair to
ERROR: that transfer ends with ServiceUnavailable, and the next kv-get naming the region is
told ``KVNoSuchRegion``, so the SDK registers again (as after a restart).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from protocol.errors import ErrorCode, S3Error
from protocol.rdma_token import RdmaToken
from protocol.verbs import TAG_LIMIT, Completion, MemoryRegion, QpLink, QpState, Sge, VerbsDevice, VerbsPeer, encode_imm

CQ_DEPTH = 4096
SEND_DEPTH = 256  # work requests in flight per queue pair
POLL_S = 0.0002


@dataclass(frozen=True)
class WriteRequest:
    """One RDMA WRITE: local scatter-gather list -> ``[remote_addr, remote_addr+length)``."""

    sges: tuple[Sge, ...]
    remote_addr: int
    length: int


def split_writes(segments: Sequence[Sge], remote_addr: int, max_sge: int, max_msg_bytes: int) -> list[WriteRequest]:
    """Work requests that write ``segments`` (consecutive in the destination) from ``remote_addr`` on.

    Each has at most ``max_sge`` elements and ``max_msg_bytes`` bytes; a segment longer than
    what is left of a request is cut across requests.
    """
    if max_sge < 1 or max_msg_bytes < 1:
        raise ValueError("max_sge and max_msg_bytes must be >= 1")
    out: list[WriteRequest] = []
    sges: list[Sge] = []
    start, size = remote_addr, 0
    for seg in segments:
        addr, left = seg.addr, seg.length
        while left:
            if len(sges) == max_sge or size == max_msg_bytes:
                out.append(WriteRequest(tuple(sges), start, size))
                sges, start, size = [], start + size, 0
            take = min(left, max_msg_bytes - size)
            sges.append(Sge(addr, take, seg.lkey))
            addr, left, size = addr + take, left - take, size + take
    if sges:
        out.append(WriteRequest(tuple(sges), start, size))
    return out


class VerbsConnection:
    """The server's end of one client region: its queue pair and the region's remote description."""

    def __init__(self, engine: "VerbsEngine", link: QpLink, addr: int, size: int, rkey: int) -> None:
        self.engine, self.link = engine, link
        self.addr, self.size, self.rkey = addr, size, rkey
        self._tags = itertools.count(1)

    @property
    def broken(self) -> bool:
        return self.link.state is QpState.ERROR

    def matches(self, token: RdmaToken) -> bool:
        """The token's rkey is the client's region's and its QP number the client's queue pair."""
        remote = self.link.remote
        return token.rkey == self.rkey and remote is not None and token.qp_num == remote.qp_num

    def begin(self) -> int:
        """A fresh tag for one kv-get (never 0, so a zeroed immediate matches nothing)."""
        return (next(self._tags) - 1) % (TAG_LIMIT - 1) + 1

    def work_requests(self, segments: Sequence[Sge], offset: int) -> list[WriteRequest]:
        """Bounds-checked against the registered region: the server never writes outside it."""
        nbytes = sum(s.length for s in segments)
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise S3Error(ErrorCode.AccessDenied, f"an RDMA write of {nbytes} bytes at offset {offset} would leave the "
                          f"{self.size} bytes the tenant registered")
        return split_writes(segments, self.addr + offset, self.engine.device.max_sge, self.engine.device.max_msg_bytes)

    def register(self, buf: np.ndarray) -> MemoryRegion:
        return self.engine.register(buf)

    def deregister(self, mr: MemoryRegion) -> None:
        self.engine.deregister(mr)

    async def write(self, local: np.ndarray, mr: MemoryRegion, offset: int) -> None:
        """WRITE ``local`` (inside registered ``mr``) at ``offset`` into the client's region."""
        await self.write_segments([Sge(local.ctypes.data, local.nbytes, mr.lkey)], offset)

    async def write_segments(self, segments: Sequence[Sge], offset: int) -> None:
        """WRITE ``segments`` at ``offset`` into the client's region; return once all have completed."""
        self.link.require_ready()
        requests = self.work_requests(segments, offset)
        await self.engine.run(self, [(w.sges, w.remote_addr, None) for w in requests])

    async def notify(self, tag: int, layer: int) -> None:
        """Layer ``layer`` of request ``tag`` has landed: a zero-length WRITE_WITH_IMM."""
        self.link.require_ready()
        await self.engine.run(self, [((), self.addr, encode_imm(tag, layer))])

    def close(self) -> None:
        self.link.close()


class VerbsEngine:
    """One device, one completion queue, the registrations' queue pairs."""

    def __init__(self, device: VerbsDevice, timeout_s: float = 30.0) -> None:
        self.device = device
        # A peer that never completes (an RNR loop on a WRITE_WITH_IMM it never posts receives for: rnr_retry 7
        # retries forever) must not hold a transfer: past this its queue pair is failed.
        self.timeout_s = timeout_s
        self.cq = device.create_cq(CQ_DEPTH)
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[asyncio.Future, VerbsConnection]] = {}
        self._poller: asyncio.Task | None = None

    def connect(self, client: VerbsPeer, addr: int, size: int) -> tuple[VerbsConnection, VerbsPeer]:
        """A queue pair connected to ``client``'s, for writes into its ``[addr, addr+size)``; and our end."""
        client.check()
        link = QpLink(self.device, self.cq, SEND_DEPTH, 1, remote_write=False)
        try:
            link.connect(client)
        except BaseException:
            link.close()
            raise
        return VerbsConnection(self, link, addr, size, client.rkey), link.local()

    def register(self, buf: np.ndarray) -> MemoryRegion:
        return self.device.reg_mr(buf.ctypes.data, buf.nbytes, remote_write=False)

    def deregister(self, mr: MemoryRegion) -> None:
        self.device.dereg_mr(mr)

    async def run(self, conn: VerbsConnection, posts: list[tuple[tuple[Sge, ...], int, int | None]]) -> None:
        """Post signaled work requests (at most SEND_DEPTH outstanding) and wait for all of them."""
        loop = asyncio.get_running_loop()
        pending: list[asyncio.Future] = []
        try:
            async with asyncio.timeout(self.timeout_s):
                for sges, remote_addr, imm in posts:
                    if len(pending) >= SEND_DEPTH:
                        await pending.pop(0)
                    wr_id = next(self._ids)
                    fut = loop.create_future()
                    self._waiting[wr_id] = (fut, conn)
                    try:
                        self.device.post_write(conn.link.qp, wr_id, sges, remote_addr, conn.rkey, imm)
                    except Exception as e:
                        del self._waiting[wr_id]
                        conn.link.fail()
                        raise S3Error(ErrorCode.ServiceUnavailable, f"posting an RDMA write failed ({type(e).__name__}: {e})") from None
                    pending.append(fut)
                    self._ensure_poller()
                for fut in pending:
                    await fut
        except TimeoutError:
            conn.link.fail()  # its outstanding requests are flushed; the region must be registered again
            raise S3Error(ErrorCode.ServiceUnavailable, f"an RDMA write to the client did not complete within {self.timeout_s:g} s "
                          "(storage_server.rdma_timeout_s); register the memory again") from None
        finally:
            for fut in pending:  # the transfer was cancelled or failed: stop caring about the rest
                fut.cancel()

    def _ensure_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        while self._waiting:
            done = self.device.poll_cq(self.cq, 64)
            for c in done:
                self._complete(c)
            if not done:
                await asyncio.sleep(POLL_S)

    def _complete(self, c: Completion) -> None:
        entry = self._waiting.pop(c.wr_id, None)
        if entry is None:
            return  # a request whose transfer was already abandoned
        fut, conn = entry
        if c.ok:
            if not fut.done():
                fut.set_result(None)
            return
        conn.link.fail()
        if not fut.done():
            fut.set_exception(S3Error(ErrorCode.ServiceUnavailable,
                                      f"an RDMA write to the client failed ({c.status}); did the client go away?"))

    def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        self.device.destroy_cq(self.cq)
        self.device.close()
