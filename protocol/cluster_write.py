"""Peer -> engine over ``rdma``: a peer writes its part of a kv-get straight into the engine's registered memory.

The kv-get's node (A) holds the tenant's registered region (its NIXL agent metadata, address
and size, checked with a proof at registration). It asks a peer (B) that holds the chunks to
write a *part* of the payload — chunks ``[chunk_lo, chunk_hi)`` of layers ``[layer_lo, layer_hi)``
— with ``peer-write``. The call carries, besides the cluster signature and the :class:`PeerGrant`
for the descriptor's keys, a :class:`RegionGrant`: the region A verified, bound to that peer
grant's nonce (so to one tenant's one kv-get), with the SHA-256 of the agent metadata, and an
expiry. B writes only inside ``[addr, addr + size)`` of that agent: a descriptor or part that
would reach outside is refused before any write.

The body is the descriptor followed by the agent metadata (``descriptor_bytes`` says where the
descriptor ends). The reply: the accepted line (:class:`~protocol.cluster.PeerFetchAccepted`),
then one :data:`LAYER_DONE` per layer of the part, in order, each sent once the part's share of
that layer has landed (with the CRC32C of that share); the stream ends after the part's last
layer. Fewer means the part failed.

The fence: A ends the part early by half-closing the connection. B checks for that end of
stream before every step of a write (and before each layer) and cancels; B's close tells A that
B's writes have stopped. A takes a failed part's remaining layers over only after that close,
or after ``cluster.fence_timeout_s`` when B does not answer at all (stalled or partitioned).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import struct
import time
from dataclasses import asdict, dataclass
from typing import Any

from .cluster_auth import _mac, denied
from .errors import ErrorCode, S3Error

LAYER_DONE = struct.Struct(">II")  # layer, CRC32C of the part's share of it
REGION_GRANT_VERSION = 1


def agent_digest(metadata: bytes) -> str:
    return hashlib.sha256(metadata).hexdigest()


@dataclass(frozen=True)
class RegionGrant:
    """Which registered memory a peer may write for one kv-get: ``[addr, addr+size)`` of the agent whose metadata
    has ``agent_sha256``, for the kv-get whose peer grant carries ``grant_nonce``."""

    tenant: str
    request_id: str
    grant_nonce: str
    agent_sha256: str
    addr: int
    size: int
    device: int
    expires: float

    def sign(self, key: bytes) -> str:
        text = base64.urlsafe_b64encode(json.dumps({"v": REGION_GRANT_VERSION, **asdict(self)}, separators=(",", ":")).encode())
        payload = text.rstrip(b"=").decode()
        return f"{payload}.{_mac(key, 'region:' + payload)}"

    @classmethod
    def verify(cls, token: object, key: bytes, metadata: bytes, now: float | None = None) -> "RegionGrant":
        """The region grant ``token`` carries, if the cluster key signed it for this agent metadata and it has not expired."""
        if not isinstance(token, str):
            raise denied("it carries no region grant")
        text, _, mac = token.partition(".")
        if not text or not hmac.compare_digest(mac, _mac(key, "region:" + text)):
            raise denied("its region grant's signature does not match the cluster key")
        try:
            fields = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
            if fields.pop("v") != REGION_GRANT_VERSION:
                raise ValueError("version")
            grant = cls(**fields)
        except (ValueError, TypeError, KeyError):
            raise denied("its region grant is malformed") from None
        if (time.time() if now is None else now) > grant.expires:
            raise denied("its region grant has expired")
        if not hmac.compare_digest(grant.agent_sha256, agent_digest(metadata)):
            raise denied("the engine agent is not the one its region grant names")
        return grant


@dataclass(frozen=True)
class WritePart:
    """Chunks ``[chunk_lo, chunk_hi)`` of layers ``[layer_lo, layer_hi)`` of a kv-get's payload."""

    chunk_lo: int
    chunk_hi: int
    layer_lo: int
    layer_hi: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any], num_chunks: int, num_layers: int) -> "WritePart":
        values = {}
        for name in ("chunk_lo", "chunk_hi", "layer_lo", "layer_hi"):
            v = obj.get(name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise S3Error(ErrorCode.InvalidRequest, f"bad peer-write: field {name!r} must be an integer", extra={"ArgumentName": name})
            values[name] = v
        p = cls(**values)
        if not (0 <= p.chunk_lo < p.chunk_hi <= num_chunks and 0 <= p.layer_lo < p.layer_hi <= num_layers):
            raise S3Error(ErrorCode.InvalidRequest, f"bad peer-write: part {p} is outside the descriptor's {num_chunks} chunks "
                          f"and {num_layers} layers", extra={"ArgumentName": "chunk_lo"})
        return p

    @property
    def chunks(self) -> int:
        return self.chunk_hi - self.chunk_lo

    def extent(self, base: int, chunk_slice: int, num_chunks: int) -> tuple[int, int]:
        """The lowest and one past the highest byte offset (in the region) this part writes."""
        lo = base + self.layer_lo * num_chunks * chunk_slice + self.chunk_lo * chunk_slice
        hi = base + (self.layer_hi - 1) * num_chunks * chunk_slice + self.chunk_hi * chunk_slice
        return lo, hi


def check_inside(grant: RegionGrant, part: WritePart, base: int, chunk_slice: int, num_chunks: int) -> None:
    """AccessDenied when any byte ``part`` would write lies outside the region the grant names."""
    lo, hi = part.extent(base, chunk_slice, num_chunks)
    if lo < 0 or hi > grant.size:
        raise denied(f"the write [{lo}, {hi}) lies outside the {grant.size}-byte region the tenant registered")
