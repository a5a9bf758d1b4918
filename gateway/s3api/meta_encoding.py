"""User-metadata values on the wire, both ways, so non-ASCII text comes back as the text that was sent.

botocore sends a non-ASCII ``x-amz-meta-*`` value as UTF-8 bytes but reads response headers as
ISO-8859-1, as HTTP defines header octets (RFC 9110 §5.5 obs-text) and as Java's and .NET's clients
read them too; a curl user may send Latin-1 bytes. A value is therefore stored as text (``gateway.auth.sigv4.header_text``:
the header's bytes read as UTF-8, or as Latin-1 where they are not UTF-8) and written back: ASCII as it is; text
Latin-1 can carry as its Latin-1 bytes (``Hello Worldé`` goes back as ``...\\xe9``, which boto3 and
aws-cli read as ``é``); text beyond Latin-1 (CJK, emoji) as its UTF-8 bytes, exactly as a UTF-8 client
(Go, curl) sent it (boto3 reads those as Latin-1: no bytes would give it such text back); text with
control characters as an RFC 2047 encoded-word ``=?UTF-8?B?...?=``, the mail-safe form S3 documents.
An encoded-word the client sent is kept as that word.

aiohttp writes every header value as UTF-8, so responses carrying such a value write those header
lines themselves (:class:`MetadataResponse`, :class:`MetadataStreamResponse`).
"""

from __future__ import annotations

import base64

from aiohttp import web

META_PREFIX = "x-amz-meta-"


def wire_bytes(text: str) -> bytes:
    """The header octets that carry ``text`` back to a client (see the module docstring)."""
    if not text.isprintable():  # control characters cannot go into a header line
        return f"=?UTF-8?B?{base64.b64encode(text.encode('utf-8', 'surrogatepass')).decode()}?=".encode("ascii")
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode("utf-8")


class _WritesMetadataLines:
    """Writes the non-ASCII metadata header lines itself, after aiohttp has serialised the others."""

    _meta_lines: list[tuple[str, bytes]]

    def _split_metadata(self, headers: dict[str, str]) -> dict[str, str]:
        self._meta_lines = []
        plain = {}
        for name, value in headers.items():
            if name.lower().startswith(META_PREFIX) and not (value.isascii() and value.isprintable()):
                self._meta_lines.append((name, wire_bytes(value)))
            else:
                plain[name] = value
        return plain

    async def _write_headers(self) -> None:
        writer = self._payload_writer  # type: ignore[attr-defined]
        if not self._meta_lines:
            return await super()._write_headers()  # type: ignore[misc]
        if not hasattr(writer, "_headers_buf"):  # another aiohttp: the mail-safe form, which any version writes
            for name, raw in self._meta_lines:
                text = raw.decode("latin-1")
                self._headers[name] = text if text.isascii() else f"=?UTF-8?B?{base64.b64encode(text.encode()).decode()}?="  # type: ignore[attr-defined]
            return await super()._write_headers()  # type: ignore[misc]
        immediately = self._send_headers_immediately  # type: ignore[has-type]
        self._send_headers_immediately = False
        try:
            await super()._write_headers()  # type: ignore[misc]
        finally:
            self._send_headers_immediately = immediately
        buf: bytes = writer._headers_buf
        lines = b"".join(name.encode("ascii") + b": " + raw + b"\r\n" for name, raw in self._meta_lines)
        writer._headers_buf = buf[:-2] + lines + b"\r\n"  # before the blank line that ends the head
        if immediately:
            writer.send_headers()


class MetadataResponse(_WritesMetadataLines, web.Response):
    def __init__(self, *, status: int, headers: dict[str, str], body: bytes | None = None) -> None:
        super().__init__(status=status, headers=self._split_metadata(headers), body=body)


class MetadataStreamResponse(_WritesMetadataLines, web.StreamResponse):
    def __init__(self, *, status: int, headers: dict[str, str]) -> None:
        super().__init__(status=status, headers=self._split_metadata(headers))
