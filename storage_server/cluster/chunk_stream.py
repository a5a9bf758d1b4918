"""Receiving a peer-fetch stream (:mod:`protocol.cluster`): the reply line, then per chunk a head, a version tag and the
chunk's bytes, each received straight into its own buffer.

An ``asyncio.StreamReader`` copies every byte twice on the way in (into its buffer, then out into the ``bytes``
``readexactly`` returns) and pauses and resumes the socket each time its 64 KiB mark is crossed; at a 64 MB prefix
that was the receiving node's largest cost after the cache writes. Here the socket ``recv``\\s into the chunk's own
buffer (:class:`asyncio.BufferedProtocol`), and reading pauses only when ``window_bytes`` of received chunks wait for
the consumer. Nothing is checked here but framing bounds; the consumer checks each chunk (:mod:`.peer_client`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from protocol.cluster import CHUNK_HEAD, MAX_VERSION_BYTES, NOT_HELD
from protocol.rpc import MAX_REQUEST_LINE


class StreamBroken(Exception):
    """The stream ended, or framed something no chunk can be, before the consumer had what it asked for."""


@dataclass
class Received:
    """One framed chunk as it came: its head's fields, the version tag and the bytes (``data`` empty for NOT_HELD)."""

    index: int
    size: int
    crc: int
    version: str
    data: bytearray | memoryview


# Where a chunk (index, size) is received: memory the caller owns (a kv-get's arrivals), or None for a buffer of its own.
Destination = Callable[[int, int], memoryview | None]


class ChunkStream(asyncio.BufferedProtocol):
    """The receiving end of one peer call: :meth:`reply` is its reply line, :meth:`next` each chunk that follows.
    ``max_size`` bounds a chunk's declared size (larger: the stream is broken, nothing is allocated for it);
    ``destination`` may name where a chunk is received (its bytes are written there before they are checked)."""

    def __init__(self, max_size: int, window_bytes: int = 8 << 20, destination: Destination | None = None) -> None:
        self.max_size, self.window_bytes, self.destination = max_size, window_bytes, destination
        self.transport: asyncio.Transport | None = None
        self._line = bytearray()
        self._reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._head = bytearray(CHUNK_HEAD.size)
        self._target: memoryview = memoryview(self._head)  # what the next bytes fill
        self._pos = 0
        self._stage = "line"  # line -> head -> version -> data -> head ...
        self._current: Received | None = None
        self._ready: deque[Received] = deque()
        self._queued = 0
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._paused = False
        self._scratch = bytearray(1 << 16)  # the reply line arrives through here

    # -- the protocol -------------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._stage == "line":
            return memoryview(self._scratch)
        return self._target[self._pos:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._stage == "line":
            self._take_line(memoryview(self._scratch)[:nbytes])
            return
        self._pos += nbytes
        if self._pos == len(self._target):
            self._advance()

    def _take_line(self, got: memoryview) -> None:
        end = bytes(got).find(b"\n")
        if end < 0:
            self._line += got
            if len(self._line) > MAX_REQUEST_LINE:
                self._fail(StreamBroken("the reply line is too long"))
            return
        self._line += got[: end + 1]
        if not self._reply.done():
            self._reply.set_result(bytes(self._line))
        self._stage, self._target, self._pos = "head", memoryview(self._head), 0
        rest = got[end + 1:]
        while len(rest) and self._error is None:  # bytes of the stream that came with the line
            n = min(len(rest), len(self._target) - self._pos)
            self._target[self._pos:self._pos + n] = rest[:n]
            rest = rest[n:]
            self._pos += n
            if self._pos == len(self._target):
                self._advance()

    def _advance(self) -> None:
        """The current unit is complete: frame the next one."""
        if self._stage == "head":
            index, size, crc, version_len = CHUNK_HEAD.unpack(self._head)
            if size == NOT_HELD:
                self._deliver(Received(index, size, crc, "", bytearray()))
                self._stage, self._target, self._pos = "head", memoryview(self._head), 0
                return
            if version_len > MAX_VERSION_BYTES or size > self.max_size:
                self._fail(StreamBroken(f"a chunk head declares {size} bytes and a {version_len}-byte version tag"))
                return
            into = self.destination(index, size) if self.destination is not None else None
            self._current = Received(index, size, crc, "", into if into is not None else bytearray(size))
            if version_len:
                self._stage, self._target = "version", memoryview(bytearray(version_len))
            else:
                self._stage, self._target = "data", memoryview(self._current.data)
        elif self._stage == "version":
            assert self._current is not None
            self._current.version = bytes(self._target).decode("ascii", "replace")
            self._stage, self._target = "data", memoryview(self._current.data)
        else:
            assert self._current is not None
            self._deliver(self._current)
            self._current = None
            self._stage, self._target = "head", memoryview(self._head)
        self._pos = 0
        if self._stage == "data" and not len(self._target):  # an empty chunk: complete as soon as framed
            self._advance()

    def _deliver(self, chunk: Received) -> None:
        self._ready.append(chunk)
        self._queued += len(chunk.data)
        if self._queued >= self.window_bytes and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        if not self._reply.done():
            self._reply.set_exception(error)
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def eof_received(self) -> bool:
        self._fail(StreamBroken("the peer ended the stream"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc if isinstance(exc, OSError) else StreamBroken("the connection closed"))

    # -- the consumer ---------------------------------------------------------------------------------------------
    async def reply(self, timeout_s: float) -> bytes:
        return await asyncio.wait_for(asyncio.shield(self._reply), timeout_s)

    async def next(self, timeout_s: float) -> Received:
        """The next chunk (or NOT_HELD head) in arrival order; StreamBroken / OSError when the stream ended first,
        TimeoutError after ``timeout_s`` of silence."""
        while not self._ready:
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self._waiter, timeout_s)
            finally:
                self._waiter = None
        chunk = self._ready.popleft()
        self._queued -= len(chunk.data)
        if self._paused and self._queued < self.window_bytes // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
