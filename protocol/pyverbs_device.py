"""The real :class:`~protocol.verbs.VerbsDevice`: rdma-core's pyverbs, imported only when opened.

pyverbs ships with rdma-core (``python3-pyverbs`` on Debian/Ubuntu, or the ``pyverbs`` extra
built against the installed rdma-core); it is never a hard dependency. Everything above these
calls — the queue pair's state machine, work-request construction, immediates, completions —
is in :mod:`protocol.verbs` and the engines, tested against a fake device.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from .verbs import Completion, MemoryRegion, Opcode, Sge, VerbsPeer

PORT = 1
GID_INDEX = 0  # RoCE v2 deployments usually want the index ibv_devinfo -v lists for RoCE v2


@functools.cache
def verbs_available() -> tuple[bool, str]:
    """Whether pyverbs imports and an RDMA device exists here, and why not."""
    try:
        from pyverbs.device import get_device_list
    except Exception as e:  # ImportError, or a pyverbs built against another rdma-core
        return False, f"pyverbs does not import ({type(e).__name__}: {e}); install rdma-core's python3-pyverbs"
    try:
        devices = get_device_list()
    except Exception as e:
        return False, f"listing RDMA devices failed ({type(e).__name__}: {e})"
    if not devices:
        return False, "no RDMA device (ibv_devices lists none)"
    return True, ""


class PyverbsDevice:
    """One opened device, its protection domain and port attributes."""

    def __init__(self, name: str = "") -> None:
        import pyverbs.enums as e
        from pyverbs.device import Context, get_device_list
        from pyverbs.pd import PD

        self._e = e
        self._opcodes = {e.IBV_WC_RDMA_WRITE: Opcode.WRITE, e.IBV_WC_RECV_RDMA_WITH_IMM: Opcode.RECV_WITH_IMM}
        if not name:
            devices = get_device_list()
            if not devices:
                raise RuntimeError("no RDMA device")
            name = devices[0].name.decode()
        self.ctx: Any = Context(name=name)
        self.pd: Any = PD(self.ctx)
        port = self.ctx.query_port(PORT)
        self.lid = port.lid
        self.gid = bytes.fromhex(str(self.ctx.query_gid(PORT, GID_INDEX)).replace(":", ""))
        self.max_msg_bytes = port.max_msg_sz
        self.max_sge = min(self.ctx.query_device().max_sge, 16)
        self._mtu = port.active_mtu
        self._mrs: dict[int, Any] = {}

    def reg_mr(self, addr: int, length: int, remote_write: bool) -> MemoryRegion:
        from pyverbs.mr import MR

        e = self._e
        access = e.IBV_ACCESS_LOCAL_WRITE | (e.IBV_ACCESS_REMOTE_WRITE if remote_write else 0)
        mr = MR(self.pd, length, access, address=addr)
        return MemoryRegion(addr, length, mr.lkey, mr.rkey, mr)

    def dereg_mr(self, mr: MemoryRegion) -> None:
        mr.handle.close()

    def create_cq(self, depth: int) -> Any:
        from pyverbs.cq import CQ

        return CQ(self.ctx, depth)

    def create_qp(self, cq: Any, max_send_wr: int, max_recv_wr: int) -> tuple[Any, int]:
        from pyverbs.qp import QP, QPCap, QPInitAttr

        cap = QPCap(max_send_wr=max_send_wr, max_recv_wr=max_recv_wr, max_send_sge=self.max_sge, max_recv_sge=1)
        qp = QP(self.pd, QPInitAttr(qp_type=self._e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=1))
        return qp, qp.qp_num

    def to_init(self, qp: Any, remote_write: bool) -> None:
        from pyverbs.qp import QPAttr

        e = self._e
        attr = QPAttr(port_num=PORT)
        attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | (e.IBV_ACCESS_REMOTE_WRITE if remote_write else 0)
        qp.to_init(attr)

    def to_rtr(self, qp: Any, remote: VerbsPeer) -> None:
        from pyverbs.addr import GID as Gid
        from pyverbs.addr import AHAttr, GlobalRoute
        from pyverbs.qp import QPAttr

        gid = bytes.fromhex(remote.gid)
        attr = QPAttr(port_num=PORT)
        attr.path_mtu = self._mtu
        attr.dest_qp_num = remote.qp_num
        attr.rq_psn = remote.psn
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = 12
        if any(gid):
            dgid = Gid(":".join(gid[i : i + 2].hex() for i in range(0, 16, 2)))
            attr.ah_attr = AHAttr(dlid=remote.lid, port_num=PORT, is_global=1, gr=GlobalRoute(dgid=dgid, sgid_index=GID_INDEX))
        else:
            attr.ah_attr = AHAttr(dlid=remote.lid, port_num=PORT)
        qp.to_rtr(attr)

    def to_rts(self, qp: Any, psn: int) -> None:
        from pyverbs.qp import QPAttr

        attr = QPAttr(port_num=PORT)
        attr.sq_psn = psn
        attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic = 14, 7, 7, 1
        qp.to_rts(attr)

    def post_write(self, qp: Any, wr_id: int, sges: Sequence[Sge], remote_addr: int, rkey: int, imm: int | None) -> None:
        from pyverbs.wr import SGE, SendWR

        e = self._e
        opcode = e.IBV_WR_RDMA_WRITE if imm is None else e.IBV_WR_RDMA_WRITE_WITH_IMM
        sg = [SGE(s.addr, s.length, s.lkey) for s in sges]
        wr = SendWR(wr_id=wr_id, opcode=opcode, num_sge=len(sg), sg=sg or None, send_flags=e.IBV_SEND_SIGNALED,
                    imm_data=0 if imm is None else imm)
        wr.set_wr_rdma(rkey, remote_addr)
        qp.post_send(wr)

    def post_recv(self, qp: Any, wr_id: int) -> None:
        from pyverbs.wr import RecvWR

        qp.post_recv(RecvWR(wr_id=wr_id, num_sge=0))

    def poll_cq(self, cq: Any, max_entries: int) -> list[Completion]:
        e = self._e
        n, wcs = cq.poll(num_entries=max_entries)
        out = []
        for wc in wcs[:n]:
            opcode = self._opcodes.get(wc.opcode, Opcode.WRITE)
            ok = wc.status == e.IBV_WC_SUCCESS
            out.append(Completion(wc.wr_id, opcode, ok, "success" if ok else f"ibv_wc_status {wc.status}",
                                  wc.imm_data if opcode is Opcode.RECV_WITH_IMM else None))
        return out

    def destroy_qp(self, qp: Any) -> None:
        qp.close()

    def destroy_cq(self, cq: Any) -> None:
        cq.close()

    def close(self) -> None:
        self.pd.close()
        self.ctx.close()
