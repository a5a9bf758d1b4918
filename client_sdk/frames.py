"""Reading the kv-get frame stream (``protocol.wire``) from an HTTP response.

DATA payloads are copied straight from the received network buffers into the
destination (one copy, no reassembly); LAYER frames become layer-ready events.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from aiohttp import ClientPayloadError, StreamReader

from protocol.errors import ErrorCode, S3Error
from protocol.wire import FRAME_SIZE, Frame, unpack_frame


class FrameStream:
    def __init__(self, content: StreamReader) -> None:
        self._content = content
        self._pending = memoryview(b"")

    async def _more(self) -> memoryview:
        if self._pending:
            piece, self._pending = self._pending, memoryview(b"")
            return piece
        try:
            data = await self._content.readany()
        except asyncio.TimeoutError:
            raise S3Error(ErrorCode.RequestTimeout, "the KV stream sent nothing within the client's read_timeout") from None
        except ClientPayloadError:  # the HTTP body was cut short
            data = b""
        if not data:
            raise S3Error(ErrorCode.ServiceUnavailable, "The KV stream ended in the middle of a frame (the gateway or storage server went away).")
        return memoryview(data)

    async def _read_exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            piece = await self._more()
            take = min(n - len(out), len(piece))
            out += piece[:take]
            self._pending = piece[take:]
        return bytes(out)

    async def read_into(self, dest: memoryview, n: int, received: Callable[[memoryview], None] | None = None) -> None:
        """``n`` bytes into ``dest``; ``received`` sees each part as soon as it is in (to checksum it while cached)."""
        pos = 0
        while pos < n:
            piece = await self._more()
            take = min(n - pos, len(piece))
            dest[pos : pos + take] = piece[:take]
            self._pending = piece[take:]
            if received is not None:
                received(dest[pos : pos + take])
            pos += take

    async def next_frame(self) -> Frame | None:
        if not self._pending and self._content.at_eof():
            return None
        try:
            head = await self._read_exact(FRAME_SIZE)
        except S3Error:
            if not self._pending and self._content.at_eof():
                return None
            raise
        return unpack_frame(head)

    async def read_payload(self, n: int) -> bytearray:
        """A frame's ``n`` payload bytes, in a buffer of their own (an ENCODED slice, kept until it is decoded)."""
        buf = bytearray(n)
        await self.read_into(memoryview(buf), n)
        return buf

    async def read_json(self, frame: Frame) -> dict:
        return json.loads(await self._read_exact(frame.length))
