"""``x-amz-rdma-token``: the S3-over-RDMA convention for a plain GET whose bytes land in the client's memory.

S3-over-RDMA stores (NVIDIA cuObject and the servers that speak it: MinIO AIStor, NooBaa's
"S3 over RDMA" design, Dell ObjectScale and VAST clients in NIXL's obj plugin, versitygw's
cuObject middleware) let a client propose RDMA with one request header, ``x-amz-rdma-token``,
whose value describes registered memory as colon-separated lowercase hex fields
(``"%016lx:%08x:%08x:%04x:%06x:%01x:%016lx%016lx"``)::

    remote address : size : rkey : LID : QP number (DCT number) : GID present (0/1) : GID

The server decides per request. If it writes the object into that memory, the response has
no body and carries ``x-amz-rdma-reply`` (``200``) and ``x-amz-rdma-bytes-transferred``; if
it declines, it answers ``501 NotImplemented`` (``x-amz-rdma-reply: 501``) and the client
falls back to a plain GET. ObjectCache serves it for GETs of whole objects into memory the
same tenant registered through ``kv-register-rdma`` (see storage_server/rdma_objects.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ErrorCode, S3Error

HEADER_RDMA_TOKEN = "x-amz-rdma-token"
HEADER_RDMA_REPLY = "x-amz-rdma-reply"
HEADER_RDMA_BYTES = "x-amz-rdma-bytes-transferred"
REPLY_OK = "200"
REPLY_DECLINED = "501"

# (field, hex digits) in the order the token carries them.
FIELDS = (("addr", 16), ("size", 8), ("rkey", 8), ("lid", 4), ("qp_num", 6), ("has_gid", 1), ("gid", 32))


@dataclass(frozen=True)
class RdmaToken:
    """Registered memory ``[addr, addr+size)`` and how to reach it (rkey, LID, QP number, GID)."""

    addr: int
    size: int
    rkey: int = 0
    lid: int = 0
    qp_num: int = 0
    gid: bytes | None = None  # 16 bytes where the fabric routes by GID (RoCE)

    def encode(self) -> str:
        gid = self.gid or bytes(16)
        return (f"{self.addr:016x}:{self.size:08x}:{self.rkey:08x}:{self.lid:04x}:{self.qp_num:06x}:"
                f"{int(self.gid is not None):01x}:{gid.hex()}")

    @classmethod
    def parse(cls, text: str) -> "RdmaToken":
        """The token in a request header; anything else is InvalidArgument naming the field."""
        parts = text.strip().split(":")
        if len(parts) != len(FIELDS):
            raise _bad(f"has {len(parts)} fields, not the {len(FIELDS)} of addr:size:rkey:lid:qpn:has_gid:gid")
        values = {}
        for (name, width), part in zip(FIELDS, parts):
            if not 1 <= len(part) <= width or any(c not in "0123456789abcdefABCDEF" for c in part):
                raise _bad(f"field {name} must be at most {width} hex digits, not {part[:40]!r}")
            values[name] = int(part, 16)
        if values["has_gid"] not in (0, 1):
            raise _bad("field has_gid must be 0 or 1")
        if values["size"] == 0:
            raise _bad("field size must not be 0")
        gid = values["gid"].to_bytes(16, "big") if values["has_gid"] else None
        return cls(values["addr"], values["size"], values["rkey"], values["lid"], values["qp_num"], gid)


def _bad(why: str) -> S3Error:
    return S3Error(ErrorCode.InvalidArgument, f"{HEADER_RDMA_TOKEN} {why}", extra={"ArgumentName": HEADER_RDMA_TOKEN})
