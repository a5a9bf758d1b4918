"""A fake verbs layer for the pyverbs engine: no device exists here, so this stands in for the NIC.

Devices on one :class:`Fabric` reach each other's queue pairs by number. A posted WRITE is
checked the way a NIC would (queue pair in RTS, local keys, the remote rkey, remote-write
access and bounds of the remote memory region) and then performed with ``memmove`` into the
other side's memory; WRITE_WITH_IMM also consumes a posted receive there and completes it with
the immediate. Every work request is recorded (:attr:`Fabric.log`), and :meth:`Fabric.fail_next`
turns the next matching work request into an error completion.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from protocol.verbs import Completion, MemoryRegion, Opcode, QpState, Sge, VerbsPeer

ORDER = {QpState.RESET: QpState.INIT, QpState.INIT: QpState.RTR, QpState.RTR: QpState.RTS}


@dataclass
class FakeQp:
    qp_num: int
    cq: deque
    device: "FakeDevice"
    state: QpState = QpState.RESET
    remote: VerbsPeer | None = None
    remote_write: bool = False
    recvs: deque = field(default_factory=deque)
    transitions: list[QpState] = field(default_factory=list)


@dataclass(frozen=True)
class PostedWrite:
    """One work request as the fake NIC saw it."""

    qp_num: int
    wr_id: int
    sges: tuple[Sge, ...]
    remote_addr: int
    rkey: int
    imm: int | None

    @property
    def length(self) -> int:
        return sum(s.length for s in self.sges)


class Fabric:
    def __init__(self) -> None:
        self.qps: dict[int, FakeQp] = {}
        self.mrs: dict[int, tuple[MemoryRegion, bool]] = {}  # rkey -> (region, remote write allowed)
        self.log: list[PostedWrite] = []
        self._keys = itertools.count(0x1000)
        self._qpns = itertools.count(0x11)
        self._fail: list[tuple[str, str]] = []  # (which: "write" | "imm", status)
        self.lock = threading.Lock()  # the test's client and the in-process server run on different threads

    def fail_next(self, which: str = "write", status: str = "IBV_WC_REM_ACCESS_ERR") -> None:
        """The next WRITE (``which="write"``) or WRITE_WITH_IMM (``"imm"``) completes with ``status``."""
        self._fail.append((which, status))

    def device(self, lid: int, max_sge: int = 4, max_msg_bytes: int = 1 << 30) -> "FakeDevice":
        return FakeDevice(self, lid, max_sge, max_msg_bytes)

    def writes(self, imm: bool | None = None) -> list[PostedWrite]:
        with self.lock:
            return [w for w in self.log if imm is None or (w.imm is not None) == imm]


class FakeDevice:
    def __init__(self, fabric: Fabric, lid: int, max_sge: int, max_msg_bytes: int) -> None:
        self.fabric = fabric
        self.lid = lid
        self.gid = bytes(16)
        self.max_sge = max_sge
        self.max_msg_bytes = max_msg_bytes
        self.lkeys: dict[int, MemoryRegion] = {}
        self.closed = False

    def reg_mr(self, addr: int, length: int, remote_write: bool) -> MemoryRegion:
        with self.fabric.lock:
            key = next(self.fabric._keys)
            mr = MemoryRegion(addr, length, key, key)
            self.lkeys[key] = mr
            self.fabric.mrs[key] = (mr, remote_write)
        return mr

    def dereg_mr(self, mr: MemoryRegion) -> None:
        with self.fabric.lock:
            self.lkeys.pop(mr.lkey, None)
            self.fabric.mrs.pop(mr.rkey, None)

    def create_cq(self, depth: int) -> deque:
        return deque()

    def create_qp(self, cq: Any, max_send_wr: int, max_recv_wr: int) -> tuple[Any, int]:
        with self.fabric.lock:
            qp = FakeQp(next(self.fabric._qpns), cq, self)
            self.fabric.qps[qp.qp_num] = qp
        return qp, qp.qp_num

    def _move(self, qp: FakeQp, to: QpState) -> None:
        if ORDER.get(qp.state) is not to:
            raise RuntimeError(f"modify_qp {qp.state.value} -> {to.value}: invalid transition")
        qp.state = to
        qp.transitions.append(to)

    def to_init(self, qp: FakeQp, remote_write: bool) -> None:
        qp.remote_write = remote_write
        self._move(qp, QpState.INIT)

    def to_rtr(self, qp: FakeQp, remote: VerbsPeer) -> None:
        if remote.qp_num not in self.fabric.qps:
            raise RuntimeError(f"no queue pair {remote.qp_num:#x} on the fabric")
        qp.remote = remote
        self._move(qp, QpState.RTR)

    def to_rts(self, qp: FakeQp, psn: int) -> None:
        self._move(qp, QpState.RTS)

    def post_write(self, qp: FakeQp, wr_id: int, sges: Sequence[Sge], remote_addr: int, rkey: int, imm: int | None) -> None:
        f = self.fabric
        with f.lock:
            if qp.state is not QpState.RTS:
                raise RuntimeError(f"post_send on a queue pair in {qp.state.value}")
            if len(sges) > self.max_sge or sum(s.length for s in sges) > self.max_msg_bytes:
                raise RuntimeError("work request over max_sge or the message size")
            f.log.append(PostedWrite(qp.qp_num, wr_id, tuple(sges), remote_addr, rkey, imm))
            kind = "write" if imm is None else "imm"
            failed = next((s for w, s in f._fail if w == kind), None)
            if failed is not None:
                f._fail.remove((kind, failed))
                return self._error(qp, wr_id, imm, failed)
            for s in sges:
                mr = self.lkeys.get(s.lkey)
                if mr is None or not mr.addr <= s.addr or s.addr + s.length > mr.addr + mr.length:
                    return self._error(qp, wr_id, imm, "IBV_WC_LOC_PROT_ERR")
            assert qp.remote is not None
            peer = f.qps.get(qp.remote.qp_num)
            target = f.mrs.get(rkey)
            total = sum(s.length for s in sges)
            if (peer is None or peer.state not in (QpState.RTR, QpState.RTS) or target is None or not target[1]
                    or not target[0].addr <= remote_addr or remote_addr + total > target[0].addr + target[0].length):
                return self._error(qp, wr_id, imm, "IBV_WC_REM_ACCESS_ERR")
            if imm is not None and not peer.recvs:
                return self._error(qp, wr_id, imm, "IBV_WC_RNR_RETRY_EXC_ERR")
            at = remote_addr
            for s in sges:
                ctypes.memmove(at, s.addr, s.length)
                at += s.length
            if imm is not None:
                peer.cq.append(Completion(peer.recvs.popleft(), Opcode.RECV_WITH_IMM, imm=imm))
            qp.cq.append(Completion(wr_id, Opcode.WRITE if imm is None else Opcode.WRITE_WITH_IMM))

    def _error(self, qp: FakeQp, wr_id: int, imm: int | None, status: str) -> None:
        qp.state = QpState.ERROR
        qp.cq.append(Completion(wr_id, Opcode.WRITE if imm is None else Opcode.WRITE_WITH_IMM, ok=False, status=status))

    def post_recv(self, qp: FakeQp, wr_id: int) -> None:
        with self.fabric.lock:
            qp.recvs.append(wr_id)

    def poll_cq(self, cq: deque, max_entries: int) -> list[Completion]:
        with self.fabric.lock:
            return [cq.popleft() for _ in range(min(max_entries, len(cq)))]

    def destroy_qp(self, qp: FakeQp) -> None:
        with self.fabric.lock:
            self.fabric.qps.pop(qp.qp_num, None)

    def destroy_cq(self, cq: deque) -> None:
        cq.clear()

    def close(self) -> None:
        self.closed = True
