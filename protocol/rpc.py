"""The storage-server RPC: how the gateway (and operators' tools) talk to the daemon.

Over a Unix socket (or TCP), a request is one JSON line ``{"op": …, "body": n,
…fields}`` followed by ``n`` raw body bytes (a descriptor, a key list, a put
batch). The reply is one JSON line: ``{"ok": true, …}`` or ``{"ok": false,
"error": {code, message, resource, extra}}``. A ``kv-get`` reply is followed by
wire frames (:mod:`protocol.wire`) until END or ERROR, then the connection closes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .errors import ErrorCode, S3Error

MAX_REQUEST_LINE = 1 << 20


class Op(StrEnum):
    PING = "ping"
    STATUS = "status"
    KV_GET = "kv-get"
    KV_PUT = "kv-put"
    KV_LOOKUP = "kv-lookup"
    KV_REGISTER = "kv-register"
    KV_UNREGISTER = "kv-unregister"
    KV_REGISTER_RDMA = "kv-register-rdma"
    KV_TICKET = "kv-ticket"  # a data ticket for one kv-get (protocol.data_ticket); empty endpoint = no data endpoint
    KV_SESSION = "kv-session"  # a local fast-path session ticket for the gateway's caller (protocol.session)
    KV_SESSION_BIND = "kv-session-bind"  # on the session socket: the ticket in, a SessionGrant out
    KV_ESTIMATE = "kv-estimate"  # the delivery-time oracle (protocol.estimate): JSON EstimateRequest body, EstimateReply reply
    RDMA_GET_OBJECT = "rdma-get-object"  # a plain GET with x-amz-rdma-token: the object into registered memory
    # Node to node, on the peer listener only, signed with the cluster key (protocol.cluster, protocol.cluster_auth).
    PEER_LOOKUP = "peer-lookup"
    PEER_FETCH = "peer-fetch"
    PEER_TICKET = "peer-ticket"
    PEER_WRITE = "peer-write"  # peer -> engine over rdma (protocol.cluster_write)


@dataclass(frozen=True)
class RpcRequest:
    """One request line: the operation, its JSON fields and how many body bytes follow."""

    op: Op
    fields: dict[str, Any] = field(default_factory=dict)
    body_bytes: int = 0

    def encode(self) -> bytes:
        return json.dumps({"op": self.op.value, "body": self.body_bytes, **self.fields}).encode() + b"\n"

    @classmethod
    def decode(cls, line: bytes, max_body: int) -> "RpcRequest":
        """Parse a request line; a malformed one raises ``InvalidRequest`` saying what is wrong."""
        try:
            obj = json.loads(line)
        except ValueError:
            raise _bad("the request line is not JSON") from None
        if not isinstance(obj, dict):
            raise _bad("the request line must be a JSON object")
        raw_op = obj.pop("op", None)
        try:
            op = Op(raw_op)
        except ValueError:
            raise _bad(f"unknown storage-server op {raw_op!r}") from None
        n = obj.pop("body", 0)
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= max_body:
            raise _bad(f"body length {n!r} is not an integer in 0..{max_body}")
        return cls(op, obj, n)

    def text(self, name: str) -> str:
        """A required string field (``InvalidRequest`` naming it if absent)."""
        value = self.fields.get(name)
        if not isinstance(value, str):
            raise _bad(f"field {name!r} must be a string")
        return value


def _bad(message: str) -> S3Error:
    return S3Error(ErrorCode.InvalidRequest, f"bad RPC request: {message}")


# A reply whose line would be longer than this (a kv-put of 32,768 chunks answers 32,768 ETags) goes as a
# short line ``{"ok": true, "reply_bytes": n}`` followed by its JSON object in ``n`` bytes: every reply
# line stays within MAX_REQUEST_LINE, whatever the reply holds.
MAX_REPLY_LINE = MAX_REQUEST_LINE // 2
MAX_REPLY_BYTES = 256 << 20
REPLY_BYTES = "reply_bytes"


def encode_reply(fields: dict[str, Any], max_line: int = MAX_REPLY_LINE) -> bytes:
    """The reply as one line, or, from ``max_line`` bytes on, as a short line announcing the bytes that follow."""
    obj = json.dumps({"ok": True, **fields}).encode()
    if len(obj) < max_line:
        return obj + b"\n"
    return json.dumps({"ok": True, REPLY_BYTES: len(obj)}).encode() + b"\n" + obj


def encode_error(err: S3Error) -> bytes:
    return json.dumps({"ok": False, "error": err.to_dict()}).encode() + b"\n"


def decode_reply(line: bytes) -> dict[str, Any]:
    """The reply's fields, or the S3Error it carries. A reply sent after its line (:func:`reply_bytes`
    says how long) is decoded by this too, given those bytes."""
    reply = json.loads(line)
    if not isinstance(reply, dict):
        raise ValueError("the reply line must be a JSON object")
    if not reply.pop("ok", False):
        raise S3Error.from_dict(reply.get("error") or {})
    return reply


def reply_bytes(fields: dict[str, Any]) -> int | None:
    """How many bytes of reply follow a reply line that only announces them (None: the line was the reply)."""
    n = fields.get(REPLY_BYTES)
    if len(fields) != 1 or n is None:
        return None
    if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= MAX_REPLY_BYTES:
        raise ValueError(f"{REPLY_BYTES} {n!r} is not an integer in 1..{MAX_REPLY_BYTES}")
    return n


@dataclass(frozen=True)
class KVGetAccepted:
    """The reply line of an accepted kv-get, before its frames."""

    mode: str
    payload_bytes: int
    num_layers: int
    rdma_tag: int = 0  # rdma over pyverbs: the tag of this transfer's layer immediates (0: none)

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "payload_bytes": self.payload_bytes, "num_layers": self.num_layers, "rdma_tag": self.rdma_tag}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "KVGetAccepted":
        return cls(str(d["mode"]), int(d["payload_bytes"]), int(d["num_layers"]), int(d.get("rdma_tag", 0)))
