"""The KV extensions' HTTP contract: operations, headers and JSON bodies.

Each KV operation is a signed S3-style request whose sub-resource names the
operation (``POST /{bucket}?kv-get``). Binary bodies (descriptor, key list,
put batch) are defined in :mod:`protocol.wire`; the small JSON bodies are the
records below, which the gateway writes and the client SDK reads.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, TypeVar

from .errors import ErrorCode, S3Error


class KVOp(StrEnum):
    """The sub-resource that selects a KV operation."""

    GET = "kv-get"  # POST /{bucket}: descriptor in, frame stream out
    PUT = "kv-put"  # POST /{bucket}: put batch in, PutReply out
    LOOKUP = "kv-lookup"  # POST /{bucket}: key list in, LookupReply out
    REGISTER = "kv-register"  # POST /: RegisterRequest in, RegisterTicket out (then the shm hand-over)
    REGISTER_RDMA = "kv-register-rdma"  # POST /: RdmaRegisterRequest in, RegisterReply out
    UNREGISTER = "kv-unregister"  # POST /: UnregisterRequest in, {} out
    STATUS = "kv-status"  # GET /: the storage server's status
    ESTIMATE = "kv-estimate"  # POST /{bucket}: EstimateRequest in, EstimateReply out (protocol.estimate)
    SESSION = "kv-session"  # POST /{bucket}: SessionTicket out (the local fast path, protocol.session)


# Response headers of a kv-get (before its frames).
HEADER_SOFT_PIN_TTL = "x-oc-soft-pin-ttl"  # kv-put: keep these chunks cached for this many seconds (cache.soft_pin_*)
HEADER_MODE = "x-oc-mode"  # "chunkwise" or "layerwise": what the server chose
HEADER_PAYLOAD_BYTES = "x-oc-payload-bytes"  # N·L·S
HEADER_GATEWAY_S = "x-oc-gateway-s"  # seconds the gateway spent before the first byte
HEADER_RDMA_TAG = "x-oc-rdma-tag"  # rdma (pyverbs engine): the tag of this transfer's layer immediates
HEADER_LOAD_BUDGET = "x-oc-load-budget"  # kv-lookup: a LoadBudget; the reply then says how many hits land within it

FRAMES_CONTENT_TYPE = "application/x-objectcache-frames"
CHUNK_CONTENT_TYPE = "application/x-objectcache-kv-chunk"  # stored chunk objects' Content-Type
MAX_JSON_BODY = 64 * 1024

R = TypeVar("R", bound="JsonRecord")


class JsonRecord:
    """A dataclass that travels as a JSON object; decoding names the missing or mistyped field."""

    def to_json(self) -> dict[str, Any]:
        """Fields that are None by default and now are left out: peers that predate them see what they always did."""
        obj = dataclasses.asdict(self)  # type: ignore[call-overload]
        return {f.name: obj[f.name] for f in fields(self) if not (obj[f.name] is None and f.default is None)}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls: type[R], obj: object) -> R:
        if not isinstance(obj, dict):
            raise S3Error(ErrorCode.InvalidRequest, "The request body must be a JSON object.")
        hints = typing.get_type_hints(cls)
        unknown = sorted(set(obj) - set(hints))
        if unknown:
            raise S3Error(ErrorCode.InvalidArgument, f"{cls.__name__} has no field {unknown[0]!r}", extra={"ArgumentName": str(unknown[0])})
        values = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name not in obj:
                if f.default is not dataclasses.MISSING:
                    continue
                raise S3Error(ErrorCode.InvalidArgument, f"{cls.__name__} needs {f.name!r}", extra={"ArgumentName": f.name})
            values[f.name] = _checked(f.name, hints[f.name], obj[f.name])
        return cls(**values)


def _checked(name: str, typ: Any, value: object) -> object:
    origin = typing.get_origin(typ)
    if origin is list:
        (inner,) = typing.get_args(typ)
        if isinstance(value, list) and all(isinstance(v, inner) for v in value):
            return value
    elif origin in (typing.Union, types.UnionType):
        for t in typing.get_args(typ):
            if isinstance(t, type) and issubclass(t, JsonRecord) and isinstance(value, dict):
                return t.from_json(value)
        if any(_ok(t, value) for t in typing.get_args(typ)):
            return value
    elif _ok(typ, value):
        return value
    raise S3Error(ErrorCode.InvalidArgument, f"{name!r} has the wrong type ({type(value).__name__})", extra={"ArgumentName": name})


def _ok(typ: Any, value: object) -> bool:
    if typ is type(None):
        return value is None
    if typ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, typ)


def hex_field(name: str, value: str, nbytes: int | None = None) -> bytes:
    """A hex-encoded binary field, checked (InvalidArgument naming it)."""
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise S3Error(ErrorCode.InvalidArgument, f"{name!r} is not hex", extra={"ArgumentName": name}) from None
    if nbytes is not None and len(raw) != nbytes:
        raise S3Error(ErrorCode.InvalidArgument, f"{name!r} must be {nbytes} bytes", extra={"ArgumentName": name})
    return raw


@dataclass(frozen=True)
class RegisterRequest(JsonRecord):
    """``kv-register``: the size of a memfd region the client is about to hand over (see :mod:`protocol.shm`).

    ``populate``: the server faults in its whole mapping before it answers the hand-over
    (a client warming up ahead of its first fetch); otherwise pages fault in as transfers
    first touch them.
    """

    size: int
    populate: bool = False


@dataclass(frozen=True)
class RegisterTicket(JsonRecord):
    """Where and with what one-time ticket to hand the memfd over."""

    socket: str  # the storage server's hand-over Unix socket
    ticket: str  # hex, TICKET_BYTES
    size: int


MAX_RDMA_REGION_BYTES = 1 << 46  # one kv-register-rdma region
ADDRESS_LIMIT = 1 << 64  # [addr, addr+size) must be 64-bit addresses
DEVICE_LIMIT = 1 << 32  # an engine's device id (NIXL's for host memory is 0)
PROOF_BYTES = 16  # what a nixl registration proves it holds (fewer for a smaller region)
QPN_LIMIT = 1 << 24  # verbs QP numbers and PSNs are 24-bit
GID_BYTES = 16


@dataclass(frozen=True)
class VerbsPeer(JsonRecord):
    """One end of a verbs RC connection (engine ``pyverbs``): its queue pair and, from the client, its region's rkey."""

    qp_num: int
    psn: int
    lid: int
    gid: str  # hex, 16 bytes; all zeros where the fabric routes by LID (InfiniBand without GRH)
    rkey: int = 0  # the client's memory region over the registered [addr, addr+size); 0 from the server

    def check(self) -> "VerbsPeer":
        """Refuse values no device could have (InvalidArgument naming the field)."""
        for name, value, limit in (("qp_num", self.qp_num, QPN_LIMIT), ("psn", self.psn, QPN_LIMIT),
                                   ("lid", self.lid, 1 << 16), ("rkey", self.rkey, 1 << 32)):
            if not 0 <= value < limit:
                raise S3Error(ErrorCode.InvalidArgument, f"verbs.{name} {value} is outside 0..{limit - 1}", extra={"ArgumentName": f"verbs.{name}"})
        try:
            ok = len(bytes.fromhex(self.gid)) == GID_BYTES
        except ValueError:
            ok = False
        if not ok:
            raise S3Error(ErrorCode.InvalidArgument, f"verbs.gid must be {GID_BYTES} bytes in hex", extra={"ArgumentName": "verbs.gid"})
        return self


@dataclass(frozen=True)
class RdmaRegisterRequest(JsonRecord):
    """``kv-register-rdma``: memory the client registered with its RDMA engine, for one-sided writes into it.

    ``[addr, addr+size)`` on ``device`` is the registered memory. Engine ``nixl``: ``agent`` is
    the client's NIXL agent metadata (base64). Engine ``pyverbs``: ``verbs`` is the client's end
    of the RC queue pair the server connects to, with the rkey of the memory region. The server
    writes nowhere else, and only for transfers of the registering tenant.
    """

    engine: str  # "nixl" | "pyverbs": must be the server's storage_server.rdma_engine
    addr: int
    size: int
    agent: str = ""
    device: int = 0
    verbs: VerbsPeer | None = None
    # nixl: hex of the first proof_bytes(size) bytes the client wrote at addr before registering; the
    # server READs them through the agent the metadata describes, so metadata that does not lead to
    # this client's memory (another port, another process) is refused before anything is written.
    proof: str = ""

    def check(self) -> "RdmaRegisterRequest":
        """Refuse what no engine could address (InvalidArgument naming the field): a range beyond 64-bit
        addresses or a device id that is not an unsigned 32-bit number would fail only at the first write."""
        if not 1 <= self.size <= MAX_RDMA_REGION_BYTES:
            raise S3Error(ErrorCode.InvalidArgument, f"size {self.size} is outside 1..{MAX_RDMA_REGION_BYTES}", extra={"ArgumentName": "size"})
        if not 1 <= self.addr <= ADDRESS_LIMIT - self.size:
            raise S3Error(ErrorCode.InvalidArgument, f"addr {self.addr} with size {self.size} is not a range of 64-bit addresses",
                          extra={"ArgumentName": "addr"})
        if not 0 <= self.device < DEVICE_LIMIT:
            raise S3Error(ErrorCode.InvalidArgument, f"device {self.device} is outside 0..{DEVICE_LIMIT - 1}", extra={"ArgumentName": "device"})
        if self.verbs is not None:
            self.verbs.check()
        return self


def proof_bytes(size: int) -> int:
    """How many leading bytes of a nixl registration's memory its ``proof`` carries."""
    return min(PROOF_BYTES, size)


@dataclass(frozen=True)
class RegisterReply(JsonRecord):
    region_id: str  # hex
    token: str  # hex: the capability a kv-get presents
    size: int
    verbs: VerbsPeer | None = None  # pyverbs: the server's end of the queue pair


@dataclass(frozen=True)
class UnregisterRequest(JsonRecord):
    region_id: str
    token: str


@dataclass(frozen=True)
class LookupReply(JsonRecord):
    hits: int  # how many leading keys are stored
    keys: int  # how many keys were asked about
    deliverable: int | None = None  # with a LoadBudget: how many leading keys the node expects to land within it


@dataclass(frozen=True)
class LoadBudget:
    """A kv-lookup's question "how much of this prefix can you land within ``budget_s``?" (``x-oc-load-budget``).

    The node answers with the longest prefix it expects to deliver in time (its pacing and queue
    know the rate); the engine then asks only for those and recomputes the rest. ``skip``: leading
    chunks the engine already holds (they are not loaded, so they cost no time).
    """

    budget_s: float
    num_layers: int
    per_layer_chunk_bytes: int
    skip: int = 0

    def to_header(self) -> str:
        return f"{self.budget_s!r};{self.num_layers};{self.per_layer_chunk_bytes};{self.skip}"

    @classmethod
    def from_header(cls, value: str) -> "LoadBudget":
        """Strict: four fields, a finite budget > 0, layers and bytes ≥ 1, skip ≥ 0 (else InvalidArgument naming the header)."""
        try:
            budget, layers, size, skip = value.split(";")
            b = cls(float(budget), int(layers), int(size), int(skip))
        except ValueError:
            b = None
        if b is None or not (0 < b.budget_s < float("inf")) or b.num_layers < 1 or b.per_layer_chunk_bytes < 1 or b.skip < 0:
            raise S3Error(ErrorCode.InvalidArgument, f"{HEADER_LOAD_BUDGET} must be 'seconds;layers;bytes;skip' "
                          f"(seconds > 0, layers and bytes >= 1, skip >= 0), not {value[:80]!r}",
                          extra={"ArgumentName": HEADER_LOAD_BUDGET})
        return b


@dataclass(frozen=True)
class PutReply(JsonRecord):
    stored: int
    etags: list[str]
