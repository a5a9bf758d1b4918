"""What ObjectCache nodes say to each other: membership records, peer lookups, peer chunk streams.

A cluster is ObjectCache nodes in front of one upstream store (``[cluster]`` config). Each
node's storage server serves a peer listener (``cluster.listen``) that speaks the storage-
server RPC envelope (:mod:`protocol.rpc`) for two operations, both authenticated with the
cluster key (:mod:`protocol.cluster_auth`) and both acting only under a :class:`PeerGrant`
the asking node signed for one tenant's kv-get:

* ``peer-lookup`` — how many leading chunks of a key list this node holds warm in its cache
  (never asking the upstream): :class:`PeerLookupReply`.
* ``peer-fetch`` — the chunks ``keys[start:start+count]`` of the granted list, whole, in
  order (with ``fill``, fetching those it does not hold from the upstream through its cache first): the reply line (:class:`PeerFetchAccepted`), then per chunk a :data:`CHUNK_HEAD`
  (index in the granted list, size, CRC32C, length of the version), the chunk's upstream
  version (its ETag as the cache names it, so the asking node's cache can revalidate the copy
  like one it fetched itself) and its bytes, ending at the first chunk the node does not hold
  (a head with size :data:`NOT_HELD`) or after the last.

Membership: each node writes a :class:`Heartbeat` record under ObjectCache's reserved
prefix in the upstream (``.objectcache/cluster/nodes/<node_id>.json`` in the registry
bucket); a node whose record stops changing for ``cluster.missed_heartbeats`` intervals is gone.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass
from typing import Any

from .config import NODE_ID
from .errors import ErrorCode, S3Error

NODES_PREFIX = ".objectcache/cluster/nodes/"  # under the reserved prefix: tenants can neither list nor write it
# One chunk of a peer-fetch stream: index in the granted key list, size (NOT_HELD: stop), CRC32C of the bytes,
# length of the version tag that follows the head (at most MAX_VERSION_BYTES; 0: unknown).
CHUNK_HEAD = struct.Struct(">IQIB")
MAX_VERSION_BYTES = 80
NOT_HELD = (1 << 64) - 1


def _bad(name: str, why: str) -> S3Error:
    return S3Error(ErrorCode.InvalidRequest, f"bad cluster record: field {name!r} {why}", extra={"ArgumentName": name})


def _str(obj: dict[str, Any], name: str, default: str | None = None) -> str:
    value = obj.get(name, default)
    if not isinstance(value, str):
        raise _bad(name, "must be a string")
    return value


def _num(obj: dict[str, Any], name: str, kind: type = int) -> Any:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise _bad(name, f"must be a{'n integer' if kind is int else ' number'}")
    return kind(value)


@dataclass(frozen=True)
class NodeInfo:
    """One node as the others see it: its id, its peer listener and where it sits (Kubernetes topology labels)."""

    node_id: str
    address: str  # "host:port" of its peer listener
    zone: str = ""
    rack: str = ""
    host: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "NodeInfo":
        node_id, address = _str(obj, "node_id"), _str(obj, "address")
        if not NODE_ID.match(node_id):
            raise _bad("node_id", "must be 1-63 letters, digits, '.', '_' or '-'")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise _bad("address", 'must be "host:port"')
        return cls(node_id, address, _str(obj, "zone", ""), _str(obj, "rack", ""), _str(obj, "host", ""))

    def distance(self, other: "NodeInfo") -> int:
        """0 same host, 1 same rack, 2 same zone, 3 elsewhere (an empty label matches nothing)."""
        for d, label in enumerate(("host", "rack", "zone")):
            mine = getattr(self, label)
            if mine and mine == getattr(other, label):
                return d
        return 3


@dataclass(frozen=True)
class Heartbeat:
    """A node's membership record in the upstream; ``seq`` grows with every beat (readers watch it change,
    so clocks need not agree)."""

    node: NodeInfo
    seq: int
    sent_at: float
    interval_s: float

    def encode(self) -> bytes:
        return json.dumps({"node": self.node.to_json(), "seq": self.seq, "sent_at": self.sent_at,
                           "interval_s": self.interval_s}).encode()

    @classmethod
    def decode(cls, data: bytes) -> "Heartbeat":
        try:
            obj = json.loads(data)
        except ValueError:
            raise _bad("heartbeat", "is not JSON") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("node"), dict):
            raise _bad("node", "must be an object")
        return cls(NodeInfo.from_json(obj["node"]), _num(obj, "seq"), _num(obj, "sent_at", float), _num(obj, "interval_s", float))


@dataclass(frozen=True)
class PeerLookupReply:
    node_id: str
    warm: int  # leading keys of the granted list this node holds in its cache
    of: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "PeerLookupReply":
        r = cls(_str(obj, "node_id"), _num(obj, "warm"), _num(obj, "of"))
        if not 0 <= r.warm <= r.of:
            raise _bad("warm", f"{r.warm} is not in 0..{r.of}")
        return r


@dataclass(frozen=True)
class PeerFetchRange:
    """Which of the granted keys a peer-fetch asks for; ``fill``: chunks the peer does not hold it fetches from the
    upstream into its own cache first (a cold request split over two nodes' upstream links)."""

    start: int
    count: int
    fill: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any], of: int) -> "PeerFetchRange":
        fill = obj.get("fill", False)
        if not isinstance(fill, bool):
            raise _bad("fill", "must be true or false")
        r = cls(_num(obj, "start"), _num(obj, "count"), fill)
        if r.start < 0 or r.count < 1 or r.start + r.count > of:
            raise _bad("count", f"start {r.start} + count {r.count} is outside the {of} granted keys")
        return r


@dataclass(frozen=True)
class PeerFetchAccepted:
    node_id: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "PeerFetchAccepted":
        return cls(_str(obj, "node_id"))
