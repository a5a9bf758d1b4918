"""The ``pyverbs`` rdma engine's contract: what both ends exchange and the verbs calls both drive.

Client and storage server each own one end of an RC queue pair per registered region.
``kv-register-rdma`` (engine ``"pyverbs"``) carries the client's end (a
:class:`~protocol.kv_http.VerbsPeer`: QP number, PSN, LID/GID, and the rkey of its memory region
over ``[addr, addr+size)``); the reply carries the server's. The server then RDMA-WRITEs each
layer's slices into that region and announces the layer with a zero-length ``WRITE_WITH_IMM`` whose immediate is
:func:`encode_imm` ``(tag, layer)``; the tag (one per kv-get, sent back in the ``x-oc-rdma-tag``
response header) lets the client drop completions left over from an earlier, abandoned request.

The verbs calls sit behind :class:`VerbsDevice` (the real one, :mod:`protocol.pyverbs_device`,
imports pyverbs lazily; tests drive a fake that writes into local memory), and :class:`QpLink`
is the queue pair's connection state machine both ends share. It lives here, not in either
package, because the client SDK must never import the server.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import ErrorCode, S3Error
from .kv_http import QPN_LIMIT, VerbsPeer

ENGINE = "pyverbs"
IMM_LAYER_BITS = 16  # descriptors carry at most 65,536 layers (protocol.wire.MAX_LAYERS)
TAG_LIMIT = 1 << (32 - IMM_LAYER_BITS)


def encode_imm(tag: int, layer: int) -> int:
    """The 32-bit immediate of layer ``layer``'s notification in request ``tag``."""
    if not 0 <= layer < 1 << IMM_LAYER_BITS or not 0 <= tag < TAG_LIMIT:
        raise ValueError(f"layer {layer} or tag {tag} does not fit the immediate")
    return tag << IMM_LAYER_BITS | layer


def decode_imm(imm: int) -> tuple[int, int]:
    """``(tag, layer)`` of an immediate."""
    return imm >> IMM_LAYER_BITS, imm & ((1 << IMM_LAYER_BITS) - 1)


# -- the verbs interface -------------------------------------------------------------


@dataclass(frozen=True)
class MemoryRegion:
    """Registered memory: ``[addr, addr+length)``, its local and remote keys."""

    addr: int
    length: int
    lkey: int
    rkey: int
    handle: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Sge:
    """One scatter-gather element: local registered memory to send from."""

    addr: int
    length: int
    lkey: int


class Opcode(enum.Enum):
    WRITE = "write"
    WRITE_WITH_IMM = "write_with_imm"
    RECV_WITH_IMM = "recv_with_imm"  # the target's side of a WRITE_WITH_IMM (consumes a posted receive)


@dataclass(frozen=True)
class Completion:
    wr_id: int
    opcode: Opcode
    ok: bool = True
    status: str = "success"  # the device's words for a failure (ibv_wc_status_str)
    imm: int | None = None


class QpState(enum.Enum):
    RESET = "RESET"
    INIT = "INIT"
    RTR = "RTR"
    RTS = "RTS"
    ERROR = "ERROR"


class VerbsDevice(Protocol):
    """The few verbs calls the engine needs: one opened device and its protection domain."""

    lid: int
    gid: bytes
    max_sge: int  # scatter-gather elements per work request
    max_msg_bytes: int  # bytes per RDMA WRITE

    def reg_mr(self, addr: int, length: int, remote_write: bool) -> MemoryRegion: ...
    def dereg_mr(self, mr: MemoryRegion) -> None: ...
    def create_cq(self, depth: int) -> Any: ...
    def create_qp(self, cq: Any, max_send_wr: int, max_recv_wr: int) -> tuple[Any, int]:
        """An RC queue pair in RESET, both queues on ``cq``; ``(qp, qp_num)``."""
        ...
    def to_init(self, qp: Any, remote_write: bool) -> None: ...
    def to_rtr(self, qp: Any, remote: VerbsPeer) -> None: ...
    def to_rts(self, qp: Any, psn: int) -> None: ...
    def post_write(self, qp: Any, wr_id: int, sges: Sequence[Sge], remote_addr: int, rkey: int, imm: int | None) -> None:
        """RDMA WRITE (``imm`` None) or WRITE_WITH_IMM of ``sges`` to ``remote_addr``, signaled."""
        ...
    def post_recv(self, qp: Any, wr_id: int) -> None:
        """A zero-length receive for one incoming WRITE_WITH_IMM."""
        ...
    def poll_cq(self, cq: Any, max_entries: int) -> list[Completion]: ...
    def destroy_qp(self, qp: Any) -> None: ...
    def destroy_cq(self, cq: Any) -> None: ...
    def close(self) -> None: ...


class QpLink:
    """One RC queue pair and its connection state machine: RESET → INIT → RTR → RTS, or ERROR."""

    def __init__(self, device: VerbsDevice, cq: Any, max_send_wr: int, max_recv_wr: int, remote_write: bool) -> None:
        self.device = device
        self.qp, self.qp_num = device.create_qp(cq, max_send_wr, max_recv_wr)
        self.psn = secrets.randbelow(QPN_LIMIT)
        self.remote_write = remote_write
        self.state = QpState.RESET
        self.remote: VerbsPeer | None = None

    def local(self, rkey: int = 0) -> VerbsPeer:
        return VerbsPeer(self.qp_num, self.psn, self.device.lid, self.device.gid.hex(), rkey)

    def connect(self, remote: VerbsPeer) -> None:
        """Walk the queue pair to RTS towards ``remote``; a device that refuses a step leaves it in ERROR."""
        if self.state is not QpState.RESET:
            raise S3Error(ErrorCode.InvalidRequest, f"the queue pair is {self.state.value}, not RESET: it connects once")
        remote.check()
        steps = ((QpState.INIT, lambda: self.device.to_init(self.qp, self.remote_write)),
                 (QpState.RTR, lambda: self.device.to_rtr(self.qp, remote)),
                 (QpState.RTS, lambda: self.device.to_rts(self.qp, self.psn)))
        for state, step in steps:
            try:
                step()
            except Exception as e:
                self.state = QpState.ERROR
                raise S3Error(ErrorCode.ServiceUnavailable,
                              f"the RDMA queue pair could not move to {state.value} ({type(e).__name__}: {e})") from None
            self.state = state
        self.remote = remote

    def require_ready(self) -> None:
        if self.state is not QpState.RTS:
            raise S3Error(ErrorCode.ServiceUnavailable, f"the RDMA connection is {self.state.value}, not RTS (register the memory again)")

    def fail(self) -> None:
        self.state = QpState.ERROR

    def close(self) -> None:
        self.state = QpState.ERROR
        self.device.destroy_qp(self.qp)
