"""Request bodies as verified byte streams.

``body_stream`` turns an aiohttp request body into an async iterator of data
chunks, whatever the payload mode: plain (optionally checking the signed
SHA-256), or ``aws-chunked`` with per-chunk signatures and/or trailing
``x-amz-checksum-*`` headers. Verification failures raise before the stream
ends, so a backend that commits only after the stream is exhausted never
stores a body that failed verification.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from aiohttp import StreamReader

from protocol.errors import ErrorCode, S3Error

from .sigv4 import EMPTY_SHA256, AuthResult, PayloadMode, hmac_hex

T = TypeVar("T")

READ_SIZE = 1 << 20
MAX_CHUNK_HEADER = 4096


class _Silence:
    """How long a client may send nothing while its body is read (then 400 RequestTimeout, as S3 answers)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    async def __call__(self, read: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await read
        except TimeoutError:
            raise S3Error(ErrorCode.RequestTimeout, f"The client sent no body bytes for {self.timeout_s:g} s.") from None


async def _plain(content: StreamReader, expected_sha256: str | None, silence: _Silence) -> AsyncIterator[bytes]:
    h = hashlib.sha256() if expected_sha256 else None
    while True:
        chunk = await silence(content.read(READ_SIZE))
        if not chunk:
            break
        if h is not None:
            h.update(chunk)
        yield chunk
    if h is not None and h.hexdigest() != expected_sha256:
        raise S3Error(
            ErrorCode.XAmzContentSHA256Mismatch,
            extra={"ClientComputedContentSHA256": expected_sha256 or "", "S3ComputedContentSHA256": h.hexdigest()},
        )


async def _line(content: StreamReader, silence: _Silence) -> bytes:
    try:
        line = await silence(content.readuntil(b"\r\n"))
    except S3Error:
        raise
    except Exception as exc:  # LimitOverrunError, IncompleteReadError, EOF
        raise S3Error(ErrorCode.IncompleteBody, f"Malformed aws-chunked body: {exc.__class__.__name__}") from None
    if len(line) > MAX_CHUNK_HEADER:
        raise S3Error(ErrorCode.InvalidRequest, "aws-chunked chunk header too long")
    return line[:-2]


async def _exact(content: StreamReader, n: int, silence: _Silence) -> bytes:
    try:
        return await silence(content.readexactly(n))
    except S3Error:
        raise
    except Exception:
        raise S3Error(ErrorCode.IncompleteBody) from None


async def _aws_chunked(content: StreamReader, auth: AuthResult, trailers: dict[str, str], silence: _Silence) -> AsyncIterator[bytes]:
    """Decode ``aws-chunked``; verify chunk signatures (signed modes) and collect trailers."""
    mode = auth.payload_mode
    signed = mode in (PayloadMode.STREAMING_SIGNED, PayloadMode.STREAMING_SIGNED_TRAILER)
    prev_sig = auth.seed_signature
    while True:
        header = (await _line(content, silence)).decode("latin-1")
        size_s, _, ext = header.partition(";")
        try:
            size = int(size_s.strip(), 16)
        except ValueError:
            raise S3Error(ErrorCode.InvalidRequest, f"Malformed aws-chunked chunk size {size_s[:20]!r}") from None
        # A chunk is streamed in pieces, never held whole (a client may declare a chunk of any size).
        digest = hashlib.sha256() if signed else None
        remaining = size
        while remaining:
            piece = await _exact(content, min(remaining, READ_SIZE), silence)
            remaining -= len(piece)
            if digest is not None:
                digest.update(piece)
            yield piece  # unverified yet: a failed signature below raises before the stream ends
        if signed:
            name, _, sig = ext.partition("=")
            if name.strip() != "chunk-signature":
                raise S3Error(ErrorCode.SignatureDoesNotMatch, "Missing chunk-signature in aws-chunked body.")
            data_sha = digest.hexdigest() if digest is not None else EMPTY_SHA256
            sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", auth.amz_date, auth.scope, prev_sig, EMPTY_SHA256, data_sha])
            if not hmac.compare_digest(hmac_hex(auth.signing_key, sts), sig.strip()):
                raise S3Error(ErrorCode.SignatureDoesNotMatch, "The chunk signature does not match.")
            prev_sig = sig.strip()
        if size == 0:
            break
        if await _exact(content, 2, silence) != b"\r\n":
            raise S3Error(ErrorCode.IncompleteBody, "aws-chunked chunk data not followed by CRLF")
    # Trailers (possibly none), then an empty line.
    trailer_lines: list[str] = []
    trailer_sig = None
    while True:
        line = (await _line(content, silence)).decode("latin-1")
        if not line:
            break
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "x-amz-trailer-signature":
            trailer_sig = value.strip()
        else:
            trailers[name] = value.strip()
            trailer_lines.append(f"{name}:{value.strip()}\n")
    if mode == PayloadMode.STREAMING_SIGNED_TRAILER:
        if trailer_sig is None:
            raise S3Error(ErrorCode.SignatureDoesNotMatch, "Missing x-amz-trailer-signature.")
        sts = "\n".join(
            ["AWS4-HMAC-SHA256-TRAILER", auth.amz_date, auth.scope, prev_sig,
             hashlib.sha256("".join(trailer_lines).encode()).hexdigest()]
        )
        if not hmac.compare_digest(hmac_hex(auth.signing_key, sts), trailer_sig):
            raise S3Error(ErrorCode.SignatureDoesNotMatch, "The trailer signature does not match.")


def body_stream(content: StreamReader, auth: AuthResult, trailers: dict[str, str], silence_s: float = 60.0) -> AsyncIterator[bytes]:
    """The verified, decoded body. ``trailers`` is filled before the stream ends; a client silent for
    ``silence_s`` while its body is read gets ``RequestTimeout``."""
    silence = _Silence(silence_s)
    if auth.payload_mode.is_streaming:
        return _aws_chunked(content, auth, trailers, silence)
    return _plain(content, auth.payload_sha256 if auth.payload_mode == PayloadMode.SIGNED else None, silence)
