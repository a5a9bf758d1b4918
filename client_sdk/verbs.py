"""The ``rdma`` transport's client side over the ``pyverbs`` engine: registered memory plus its own RC queue pair.

Each buffer is registered once as a memory region (remote write allowed), gets a queue pair
whose end travels in ``kv-register-rdma`` (with the region's rkey) and which connects to the
server's end from the reply. Receives are kept posted for the server's WRITE_WITH_IMMs; each
immediate says "layer ℓ of request tag t has landed" (:func:`protocol.verbs.decode_imm`).
The layer-ready iterator waits for it after the LAYER frame, so a layer is handed out only
once its notification arrived; immediates of another tag (an earlier, abandoned request on
this buffer) are dropped. A failed completion is ``ServiceUnavailable`` and the buffer is
registered afresh next time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocol.errors import ErrorCode, S3Error
from protocol.kv_http import RdmaRegisterRequest, RegisterReply
from protocol.rdma_token import RdmaToken
from protocol.verbs import ENGINE, MemoryRegion, Opcode, QpLink, QpState, VerbsDevice, decode_imm
from protocol.wire import Target, TransportKind

from .buffers import host_memory
from .destinations import BufferDestinations, Destination

MIN_BUFFER = 64 << 20
RECV_DEPTH = 512  # receives kept posted: more than the layers a server announces before we poll
POLL_S = 0.0002
NOTIFY_TIMEOUT_S = 10.0  # the LAYER frame follows the immediate's completion: it should be there already

# Sends a kv-register-rdma and returns the reply.
Register = Callable[[RdmaRegisterRequest], Awaitable[RegisterReply]]


@dataclass
class VerbsBuffer:
    """Registered memory, its queue pair, and the layers of the current request notified so far."""

    buf: np.ndarray
    mr: MemoryRegion
    link: QpLink
    cq: Any
    region_id: bytes
    token: bytes
    busy: bool = False
    tag: int = 0
    landed: set[int] = field(default_factory=set)
    user: bool = False  # the caller's memory (``out``): used only when passed again

    def expect(self, tag: int) -> None:
        self.tag, self.landed = tag, set()

    def _drain(self) -> bool:
        """Handle what the completion queue holds; whether there was anything."""
        device = self.link.device
        done = device.poll_cq(self.cq, 64)
        for c in done:
            if not c.ok:
                self.link.fail()
                raise S3Error(ErrorCode.ServiceUnavailable, f"the RDMA connection to the storage server failed ({c.status}); fetch again")
            if c.opcode is Opcode.RECV_WITH_IMM and c.imm is not None:
                device.post_recv(self.link.qp, c.wr_id)  # keep the receive queue full
                tag, layer = decode_imm(c.imm)
                if tag == self.tag:
                    self.landed.add(layer)
        return bool(done)

    async def wait_layer(self, layer: int) -> None:
        """Until the server's notification of ``layer`` (this request's tag) has arrived."""
        deadline = time.monotonic() + NOTIFY_TIMEOUT_S
        while layer not in self.landed:
            if not self._drain():
                if time.monotonic() > deadline:
                    raise S3Error(ErrorCode.ServiceUnavailable, f"layer {layer} was announced but its RDMA notification never arrived")
                await asyncio.sleep(POLL_S)


class VerbsDestinations(BufferDestinations):
    kind = TransportKind.RDMA
    verify_by_default = False  # RDMA links check their own frames; verify=True still checks each layer's CRC32C

    def __init__(self, register: Register, open_device: Callable[[], VerbsDevice]) -> None:
        self._register = register
        self._open_device = open_device
        self._device: VerbsDevice | None = None
        self._buffers: list[VerbsBuffer] = []
        self._lock = asyncio.Lock()

    async def _new_buffer(self, buf: np.ndarray) -> VerbsBuffer:
        if self._device is None:
            self._device = self._open_device()
        device = self._device
        mr = device.reg_mr(buf.ctypes.data, buf.nbytes, remote_write=True)
        cq = device.create_cq(RECV_DEPTH + 16)
        link = QpLink(device, cq, 1, RECV_DEPTH, remote_write=True)
        try:
            for i in range(RECV_DEPTH):
                device.post_recv(link.qp, i)
            reply = await self._register(RdmaRegisterRequest(ENGINE, buf.ctypes.data, buf.nbytes, verbs=link.local(mr.rkey)))
            if reply.verbs is None:
                raise S3Error(ErrorCode.InternalError, "the storage server answered a pyverbs registration without its queue pair")
            link.connect(reply.verbs)
        except BaseException:
            link.close()
            device.destroy_cq(cq)
            device.dereg_mr(mr)
            raise
        return VerbsBuffer(buf, mr, link, cq, bytes.fromhex(reply.region_id), bytes.fromhex(reply.token))

    async def acquire(self, payload_bytes: int, out: Any) -> Destination:
        """A registered buffer: the SDK's own, or ``out`` (the caller's host memory, registered once and reused)."""
        mine = host_memory(out, payload_bytes) if out is not None else None
        async with self._lock:
            for b in [b for b in self._buffers if not b.busy and b.link.state is QpState.ERROR]:
                self._drop(b)  # its connection failed: the server is told of a new one instead
            # Every idle buffer left is connected (RTS): only a failure or close changes that, and both mean ERROR.
            if mine is not None:
                fits = [b for b in self._buffers if b.user and not b.busy and b.buf.ctypes.data == mine.ctypes.data
                        and b.buf.nbytes == mine.nbytes]
            else:
                fits = [b for b in self._buffers if not b.user and not b.busy and b.buf.nbytes >= payload_bytes]
            if fits:
                b = min(fits, key=lambda b: b.buf.nbytes)
            else:
                b = await self._new_buffer(mine if mine is not None else np.empty(max(payload_bytes, MIN_BUFFER), np.uint8))
                b.user = mine is not None
                self._buffers.append(b)
            b.busy = True
        target = Target(TransportKind.RDMA, b.region_id, b.token, 0, payload_bytes)
        return Destination(target, memoryview(b.buf)[:payload_bytes], rdma=b)

    def layer_waiter(self, dest: Destination, tag: int) -> Callable[[int], Awaitable[None]] | None:
        b = dest.rdma
        assert isinstance(b, VerbsBuffer)
        b.expect(tag)
        return b.wait_layer

    def token(self, dest: Destination) -> RdmaToken:
        b = dest.rdma
        assert isinstance(b, VerbsBuffer)
        gid = b.link.device.gid
        return RdmaToken(b.buf.ctypes.data, dest.view.nbytes, b.mr.rkey, b.link.device.lid, b.link.qp_num, gid if any(gid) else None)

    def _free(self, b: VerbsBuffer) -> None:
        b.link.close()
        b.link.device.destroy_cq(b.cq)
        b.link.device.dereg_mr(b.mr)

