"""Request bodies as verified byte streams.

``body_stream`` turns an aiohttp request body into an async iterator of data
chunks, whatever the payload mode: plain (optionally checking the signed
SHA-256), or ``aws-chunked`` with per-chunk signatures and/or trailing
``x-amz-checksum-*`` headers. Verification failures raise before the stream
ends, so a backend that commits only after the stream is exhausted never
stores a body that failed verification.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator

from aiohttp import StreamReader

from protocol.errors import ErrorCode, S3Error

from .sigv4 import EMPTY_SHA256, AuthResult, PayloadMode, hmac_hex

READ_SIZE = 1 << 20
MAX_CHUNK_HEADER = 4096


async def _plain(content: StreamReader, expected_sha256: str | None) -> AsyncIterator[bytes]:
    h = hashlib.sha256() if expected_sha256 else None
    while True:
        chunk = await content.read(READ_SIZE)
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


async def _line(content: StreamReader) -> bytes:
    try:
        line = await content.readuntil(b"\r\n")
    except Exception as exc:  # LimitOverrunError, IncompleteReadError, EOF
        raise S3Error(ErrorCode.IncompleteBody, f"Malformed aws-chunked body: {exc.__class__.__name__}") from None
    if len(line) > MAX_CHUNK_HEADER:
        raise S3Error(ErrorCode.InvalidRequest, "aws-chunked chunk header too long")
    return line[:-2]


async def _exact(content: StreamReader, n: int) -> bytes:
    try:
        return await content.readexactly(n)
    except Exception:
        raise S3Error(ErrorCode.IncompleteBody) from None


async def _aws_chunked(content: StreamReader, auth: AuthResult, trailers: dict[str, str]) -> AsyncIterator[bytes]:
    """Decode ``aws-chunked``; verify chunk signatures (signed modes) and collect trailers."""
    mode = auth.payload_mode
    signed = mode in (PayloadMode.STREAMING_SIGNED, PayloadMode.STREAMING_SIGNED_TRAILER)
    prev_sig = auth.seed_signature
    while True:
        header = (await _line(content)).decode("latin-1")
        size_s, _, ext = header.partition(";")
        try:
            size = int(size_s.strip(), 16)
        except ValueError:
            raise S3Error(ErrorCode.InvalidRequest, f"Malformed aws-chunked chunk size {size_s[:20]!r}") from None
        # A chunk is streamed in pieces, never held whole (a client may declare a chunk of any size).
        digest = hashlib.sha256() if signed else None
        remaining = size
        while remaining:
            piece = await _exact(content, min(remaining, READ_SIZE))
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
        if await _exact(content, 2) != b"\r\n":
            raise S3Error(ErrorCode.IncompleteBody, "aws-chunked chunk data not followed by CRLF")
    # Trailers (possibly none), then an empty line.
    trailer_lines: list[str] = []
    trailer_sig = None
    while True:
        line = (await _line(content)).decode("latin-1")
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


def body_stream(content: StreamReader, auth: AuthResult, trailers: dict[str, str]) -> AsyncIterator[bytes]:
    """The verified, decoded body. ``trailers`` is filled before the stream ends."""
    if auth.payload_mode.is_streaming:
        return _aws_chunked(content, auth, trailers)
    return _plain(content, auth.payload_sha256 if auth.payload_mode == PayloadMode.SIGNED else None)
