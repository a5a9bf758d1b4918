"""Node-to-node authentication: every peer call is signed with the cluster key, and acts under a grant.

Two layers, both HMAC-SHA256 with ``cluster.key`` (a secret every node of one cluster holds and
no tenant ever does):

* **The call.** A peer call's RPC fields carry ``node`` (the caller), ``ts`` (Unix time),
  ``nonce`` and ``mac`` = HMAC over the operation, every other field and the SHA-256 of the
  body. :class:`CallVerifier` refuses a missing or wrong MAC, a timestamp outside
  ``window_s`` and a nonce it has already seen within the window (a replayed call).
* **The grant.** What the call may do for a tenant: :class:`PeerGrant`, signed by the node
  the tenant's own signed kv-get arrived at, after its gateway authenticated the tenant and
  checked the bucket. It is bound to the tenant, the bucket *incarnation* (a bucket deleted
  and created again by someone else is another bucket) and the SHA-256 of the exact key list,
  and expires after ``cluster.grant_ttl_s``. A peer serves only chunks of that incarnation
  named in that list, so a tenant's credentials never reach a peer and a peer can do no more
  for the tenant than the first node allowed.

Kept apart from the storage server's own RPC authentication: the cluster key authenticates
nodes to each other, nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

from .errors import ErrorCode, S3Error

GRANT_VERSION = 1
AUTH_FIELDS = ("node", "ts", "nonce", "mac")


def keys_digest(keys: list[str]) -> str:
    """The SHA-256 a grant binds: of the keys joined by newlines (keys never contain one)."""
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()


def _mac(key: bytes, text: str) -> str:
    return base64.urlsafe_b64encode(hmac.new(key, text.encode(), hashlib.sha256).digest()).rstrip(b"=").decode()


def _canonical(op: str, fields: dict[str, Any], body: bytes) -> str:
    signed = {k: v for k, v in fields.items() if k != "mac"}
    return json.dumps({"op": op, "fields": signed, "body": hashlib.sha256(body).hexdigest()}, sort_keys=True, separators=(",", ":"))


def sign_call(key: bytes, node_id: str, op: str, fields: dict[str, Any], body: bytes, now: float | None = None) -> dict[str, Any]:
    """``fields`` with the call's authentication added (send them as the RPC request's fields)."""
    out = {**fields, "node": node_id, "ts": time.time() if now is None else now, "nonce": secrets.token_hex(12)}
    out["mac"] = _mac(key, _canonical(op, out, body))
    return out


def denied(why: str) -> S3Error:
    return S3Error(ErrorCode.AccessDenied, f"Peer call refused: {why}.")


class CallVerifier:
    """Checks peer calls' MACs, freshness and nonces (the nonces of the last ``window_s`` are remembered)."""

    def __init__(self, key: bytes, window_s: float = 30.0, max_nonces: int = 100_000) -> None:
        self.key, self.window_s, self.max_nonces = key, window_s, max_nonces
        self._seen: OrderedDict[str, float] = OrderedDict()

    def verify(self, op: str, fields: dict[str, Any], body: bytes, now: float | None = None) -> str:
        """The calling node's id; AccessDenied saying why when the call is not a fresh, correctly signed one."""
        now = time.time() if now is None else now
        mac, node, ts, nonce = (fields.get(k) for k in ("mac", "node", "ts", "nonce"))
        if not isinstance(mac, str) or not isinstance(node, str) or not isinstance(nonce, str) or not isinstance(ts, (int, float)):
            raise denied("it carries no cluster signature (node, ts, nonce, mac)")
        if not hmac.compare_digest(mac, _mac(self.key, _canonical(op, fields, body))):
            raise denied("its signature does not match the cluster key")
        if abs(now - ts) > self.window_s:
            raise denied(f"its timestamp is {now - ts:+.1f} s away from this node's clock (window {self.window_s:g} s)")
        while self._seen and (next(iter(self._seen.values())) < now - self.window_s or len(self._seen) >= self.max_nonces):
            self._seen.popitem(last=False)
        if nonce in self._seen:
            raise denied("it was replayed (nonce seen before)")
        self._seen[nonce] = now
        return node


@dataclass(frozen=True)
class PeerGrant:
    """What a peer may do for one tenant's kv-get: read the chunks of ``keys_sha256`` in one bucket incarnation."""

    tenant: str
    bucket: str
    bucket_id: str
    keys_sha256: str
    count: int  # how many keys the list holds
    request_id: str
    issuer: str  # the node that signed it
    expires: float
    nonce: str

    def sign(self, key: bytes) -> str:
        payload = base64.urlsafe_b64encode(json.dumps({"v": GRANT_VERSION, **asdict(self)}, separators=(",", ":")).encode())
        text = payload.rstrip(b"=").decode()
        return f"{text}.{_mac(key, 'grant:' + text)}"

    @classmethod
    def issue(cls, key: bytes, *, tenant: str, bucket: str, bucket_id: str, keys: list[str], request_id: str, issuer: str,
              ttl_s: float) -> str:
        return cls(tenant, bucket, bucket_id, keys_digest(keys), len(keys), request_id, issuer, time.time() + ttl_s,
                   secrets.token_hex(8)).sign(key)

    @classmethod
    def verify(cls, token: object, key: bytes, keys: list[str], now: float | None = None) -> "PeerGrant":
        """The grant ``token`` carries, if the cluster key signed it for exactly ``keys`` and it has not expired."""
        if not isinstance(token, str):
            raise denied("it carries no grant")
        text, _, mac = token.partition(".")
        if not text or not hmac.compare_digest(mac, _mac(key, "grant:" + text)):
            raise denied("its grant's signature does not match the cluster key")
        try:
            fields = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
            if fields.pop("v") != GRANT_VERSION:
                raise ValueError("version")
            grant = cls(**fields)
        except (ValueError, TypeError, KeyError):
            raise denied("its grant is malformed") from None
        if (time.time() if now is None else now) > grant.expires:
            raise denied("its grant has expired")
        if grant.count != len(keys) or not hmac.compare_digest(grant.keys_sha256, keys_digest(keys)):
            raise denied("the keys are not the ones its grant names")
        return grant
