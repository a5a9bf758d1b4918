"""The direct data path of an ``http`` kv-get: a short-lived capability for the storage server's data endpoint.

Relaying every payload byte storage server → gateway → client costs the
gateway two socket copies and a chunked re-encoding per byte. With
``storage_server.data_listen`` set, a client that asks for it (header
:data:`HEADER_DIRECT` on its signed kv-get) gets, instead of the frame stream,
a :class:`DirectGrant`: the data endpoint's address and a ticket. The gateway
has authenticated the request, checked the bucket and validated the
descriptor; the storage server signed the ticket with a key only it holds
(random per start), bound to the tenant, the bucket and the incarnation of it the
gateway checked (a bucket deleted and recreated, by anyone, is another) and the
SHA-256 of that exact descriptor, valid for ``storage_server.data_ticket_ttl_s`` and once.

On the data endpoint the client speaks the storage-server RPC envelope
(:mod:`protocol.rpc`) for one operation: ``{"op": "kv-get", "ticket": …,
"body": n}`` plus the descriptor; the reply line and the frames that follow are
those the gateway would have relayed. The ticket is opaque to the client and
the gateway: only the storage server that issued it decodes and verifies it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import asdict, dataclass
from typing import Any

from .errors import ErrorCode, S3Error

HEADER_DIRECT = "x-oc-direct"  # request header of a kv-get: "1" = answer with a DirectGrant if you can
GRANT_CONTENT_TYPE = "application/x-objectcache-direct-grant+json"
TICKET_VERSION = 2


@dataclass(frozen=True)
class DirectGrant:
    """The kv-get response body when the payload comes from the data endpoint instead of the gateway."""

    endpoint: str  # "host:port" of the storage server's data endpoint
    ticket: str
    expires_in_s: float
    # A cluster peer's data endpoint (its node id; empty: the node the client asked). Should that stream break or
    # send nothing for ``stall_s`` seconds, the client asks its own node again for the layers it does not hold yet
    # (descriptor ``first_layer``): the kv-get completes through another path instead of failing.
    peer: str = ""
    stall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: object) -> "DirectGrant":
        if not isinstance(obj, dict) or not isinstance(obj.get("endpoint"), str) or not isinstance(obj.get("ticket"), str):
            raise S3Error(ErrorCode.InternalError, "a direct-grant reply needs string fields 'endpoint' and 'ticket'")
        peer, stall_s = obj.get("peer", ""), obj.get("stall_s", 0.0)
        if not isinstance(peer, str) or isinstance(stall_s, bool) or not isinstance(stall_s, (int, float)) or not stall_s >= 0:
            raise S3Error(ErrorCode.InternalError, "a direct-grant reply's 'peer' must be a string and 'stall_s' a number >= 0")
        return cls(obj["endpoint"], obj["ticket"], float(obj.get("expires_in_s", 0)), peer, float(stall_s))


@dataclass(frozen=True)
class DataTicket:
    """What a ticket grants: one kv-get of one descriptor in one tenant's bucket, until ``expires`` (Unix time)."""

    tenant: str
    bucket: str
    bucket_incarnation: str  # the bucket as it was when the ticket was granted (BucketInfo.incarnation)
    request_id: str
    descriptor_sha256: str
    expires: float
    nonce: str
    descriptor_bytes: int = -1  # its length: a request announcing another body length is refused before the body is read
    # The cluster node this ticket's kv-get serves on another node's behalf (its chunk bytes count as "peer:<via>");
    # empty: the node the tenant asked.
    via: str = ""

    def sign(self, key: bytes) -> str:
        payload = _b64(json.dumps({"v": TICKET_VERSION, **asdict(self)}, separators=(",", ":")).encode())
        return f"{payload}.{_b64(_mac(key, payload))}"

    @classmethod
    def verify(cls, token: str, key: bytes, now: float) -> "DataTicket":
        """The ticket ``token`` grants, if ``key`` signed it and it has not expired; ``AccessDenied`` saying why otherwise."""
        payload, _, mac = token.partition(".")
        try:
            given = base64.urlsafe_b64decode(mac + "=" * (-len(mac) % 4))
        except ValueError:
            given = b""
        if not payload or not hmac.compare_digest(given, _mac(key, payload)):
            raise S3Error(ErrorCode.AccessDenied, "The data ticket's signature does not match (tampered, or issued by another storage server).")
        try:
            fields = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
            if fields.pop("v") != TICKET_VERSION:
                raise ValueError("version")
            ticket = cls(**fields)
        except (ValueError, TypeError, KeyError):
            raise S3Error(ErrorCode.AccessDenied, "The data ticket is malformed.") from None
        if now > ticket.expires:
            raise S3Error(ErrorCode.AccessDenied, f"The data ticket expired {now - ticket.expires:.1f} s ago; ask the gateway again.")
        return ticket


def descriptor_digest(body: bytes | memoryview) -> str:
    return hashlib.sha256(body).hexdigest()


def _mac(key: bytes, payload: str) -> bytes:
    return hmac.new(key, payload.encode(), hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
