"""Who may talk on a TCP RPC connection: a shared key, proven on every connection by an HMAC challenge-response.

A Unix socket is private to the service user (0600); a TCP listener is reachable
by whoever can route to it, and the RPC takes the tenant named in each request
on faith. So a TCP connection starts with a handshake on a key both ends hold
(``storage_server.rpc_key_file`` or ``rpc_key``), before any request is read:

    server → ``{"auth": "hmac-sha256-v1", "purpose": P, "challenge": <32 random bytes, hex>}``
    client → ``{"auth": "hmac-sha256-v1", "challenge": <32 random bytes, hex>, "proof": hex(HMAC(key, "client"…))}``
    server → ``{"ok": true, "proof": hex(HMAC(key, "server"…))}``, or an error reply and the connection closes

Both proofs cover the purpose and both challenges, so neither side's proof can be
replayed on another connection, as the other side, or for another purpose (a
cluster key and an RPC key are separate even if an operator sets them equal).
The client checks the server's proof too: a gateway never sends its tenants'
requests to a listener that does not hold the key. The key is never sent. What
follows the handshake is not encrypted or integrity-protected: keep the RPC on a
private network (or inside a TLS tunnel) as the README says.

The functions are pure (:func:`proof`, :func:`check_proof`) plus two small async
handshakes over asyncio streams; any listener that should admit only holders of a
key (the storage-server RPC, node-to-node calls) uses them as they are.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from .config import ConfigError
from .errors import ErrorCode, S3Error

SCHEME = "hmac-sha256-v1"
CHALLENGE_BYTES = 32
MIN_KEY_BYTES = 16
MAX_HANDSHAKE_LINE = 4096
HANDSHAKE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SharedKey:
    """A secret both ends of a connection hold, and what it is for (bound into every proof)."""

    secret: bytes
    purpose: str

    def __post_init__(self) -> None:
        if len(self.secret) < MIN_KEY_BYTES:
            raise ValueError(f"a shared key must be at least {MIN_KEY_BYTES} bytes")

    def __repr__(self) -> str:  # never print the secret
        return f"SharedKey(purpose={self.purpose!r}, {len(self.secret)} bytes)"


def load_key(inline: str, path: str, purpose: str, name: str) -> SharedKey | None:
    """The key configured as ``name`` (inline text) or ``name + "_file"`` (a file's contents, surrounding
    whitespace dropped); ``None`` when neither is set. ``ValueError`` naming the setting when it is unusable."""
    if inline and path:
        raise ValueError(f"{name} and {name}_file are both set; set one")
    if path:
        try:
            text = Path(path).read_text().strip()
        except OSError as e:
            raise ValueError(f"{name}_file: cannot read {path!r} ({e.strerror or e})") from None
        where = f"{name}_file ({path!r})"
    else:
        text, where = inline.strip(), name
    if not text:
        if path:
            raise ValueError(f"{where} is empty")
        return None
    if len(text.encode()) < MIN_KEY_BYTES:
        raise ValueError(f"{where}: the key is {len(text.encode())} bytes; use at least {MIN_KEY_BYTES} "
                         "(e.g. `openssl rand -base64 32`)")
    return SharedKey(text.encode(), purpose)


def proof(key: SharedKey, role: str, server_challenge: bytes, client_challenge: bytes) -> bytes:
    """What ``role`` ("client" or "server") sends to show it holds ``key`` on the connection of these challenges."""
    message = b"\0".join((SCHEME.encode(), key.purpose.encode(), role.encode(), server_challenge, client_challenge))
    return hmac.new(key.secret, message, hashlib.sha256).digest()


def check_proof(key: SharedKey, role: str, server_challenge: bytes, client_challenge: bytes, given: bytes) -> bool:
    return hmac.compare_digest(given, proof(key, role, server_challenge, client_challenge))


def _denied(message: str) -> S3Error:
    return S3Error(ErrorCode.AccessDenied, f"RPC authentication failed: {message}")


async def _read_json(reader: asyncio.StreamReader, what: str) -> dict:
    line = await reader.readline()
    if not line:
        raise _denied(f"the peer closed the connection before its {what}")
    try:
        obj = json.loads(line)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        raise _denied(f"the peer's {what} is not a JSON object")
    return obj


def _hex(obj: dict, field: str, nbytes: int | None = None) -> bytes:
    value = obj.get(field)
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else None
    except ValueError:
        raw = None
    if raw is None or (nbytes is not None and len(raw) != nbytes):
        raise _denied(f"field {field!r} must be {'' if nbytes is None else f'{nbytes} bytes of '}hex")
    return raw


def _line(obj: dict) -> bytes:
    return json.dumps(obj).encode() + b"\n"


async def server_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: SharedKey) -> None:
    """Admit the connection's peer only if it proves it holds ``key``; ``S3Error(AccessDenied)`` otherwise
    (the caller answers it and closes). Bound it in time yourself (``asyncio.wait_for``)."""
    challenge = secrets.token_bytes(CHALLENGE_BYTES)
    writer.write(_line({"auth": SCHEME, "purpose": key.purpose, "challenge": challenge.hex()}))
    await writer.drain()
    answer = await _read_json(reader, "authentication answer")
    if answer.get("auth") != SCHEME:
        raise _denied(f"expected an {SCHEME} answer first (this listener requires the shared key)")
    theirs = _hex(answer, "challenge", CHALLENGE_BYTES)
    if not check_proof(key, "client", challenge, theirs, _hex(answer, "proof")):
        raise _denied("wrong key")
    writer.write(_line({"ok": True, "proof": proof(key, "server", challenge, theirs).hex()}))
    await writer.drain()


async def client_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: SharedKey | None) -> None:
    """Answer the listener's challenge with ``key`` and check the listener's own proof. ``S3Error(AccessDenied)``
    when the listener refuses, does not hold the key, or asks for a key and ``key`` is None."""
    hello = await _read_json(reader, "challenge")
    if hello.get("ok") is False:  # refused before any handshake (e.g. too many connections)
        raise S3Error.from_dict(hello.get("error") or {})
    if hello.get("auth") != SCHEME:
        raise _denied(f"the listener did not offer {SCHEME}")
    if key is None:
        raise _denied("the listener requires a shared key and none is configured here")
    if hello.get("purpose") != key.purpose:
        raise _denied(f"the listener wants a key for {hello.get('purpose')!r}, not {key.purpose!r}")
    server_challenge = _hex(hello, "challenge", CHALLENGE_BYTES)
    mine = secrets.token_bytes(CHALLENGE_BYTES)
    writer.write(_line({"auth": SCHEME, "challenge": mine.hex(), "proof": proof(key, "client", server_challenge, mine).hex()}))
    await writer.drain()
    reply = await _read_json(reader, "authentication reply")
    if reply.get("ok") is not True:
        raise S3Error.from_dict(reply.get("error") or {}) if isinstance(reply.get("error"), dict) else _denied("refused")
    if not check_proof(key, "server", server_challenge, mine, _hex(reply, "proof")):
        raise _denied("the listener does not hold the key (its proof does not match)")


STORAGE_RPC_PURPOSE = "storage-rpc"


def storage_rpc_key(inline: str, path: str) -> SharedKey | None:
    """The storage-server RPC's key from ``storage_server.rpc_key`` / ``rpc_key_file`` (``ConfigError`` if unusable)."""
    try:
        return load_key(inline, path, STORAGE_RPC_PURPOSE, "storage_server.rpc_key")
    except ValueError as e:
        raise ConfigError(str(e)) from None
