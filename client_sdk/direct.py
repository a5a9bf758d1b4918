"""The kv-get frame stream straight from the storage server's data endpoint (:mod:`protocol.data_ticket`).

The gateway answered the signed kv-get with a ticket; this connects to the data
endpoint, sends the ticketed request and reads the reply line and the frames
(:mod:`protocol.wire`) from a plain socket. DATA payloads are received by the
kernel straight into the destination (``recv_into``): no HTTP parsing, no
intermediate buffer, no copy in user space.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable

from protocol.data_ticket import DirectGrant
from protocol.errors import ErrorCode, S3Error
from protocol.rpc import MAX_REQUEST_LINE, KVGetAccepted, Op, RpcRequest, decode_reply
from protocol.wire import FRAME_SIZE, Frame, unpack_frame

CONNECT_TIMEOUT_S = 10.0
# One receive of frame headers takes up to this much: a burst of LAYER frames is one syscall (py-spy, shm G64x64: a
# receive per 32-byte frame, each with the selector's register/unregister when it had to wait, was the client's loop).
FRAME_BURST = 4096


class DirectFrameStream:
    """Same reading interface as :class:`client_sdk.frames.FrameStream`, over the data endpoint's socket."""

    def __init__(self, sock: socket.socket, read_timeout: float | None, keep: Callable[["DirectFrameStream"], None] | None = None) -> None:
        self._sock = sock
        # Where a stream that ended cleanly gives its connection back (the session socket's kept connections).
        self.keep = keep
        self.reused = False  # on a connection an earlier request used
        self.closed_unanswered = False  # the peer closed before any reply line
        self._timeout = read_timeout
        self._pending = memoryview(b"")
        self._burst = memoryview(bytearray(FRAME_BURST))
        self._waiter: asyncio.Future[None] | None = None
        self._watching: asyncio.AbstractEventLoop | None = None  # the loop the socket's reader is registered with
        self._deadline: float | None = None  # loop time by which the wait in progress must have had bytes (None: no read timeout)
        self._watchdog: asyncio.TimerHandle | None = None  # one timer for the stream's read timeout (see _readable)
        self._eof = False
        self.accepted: KVGetAccepted | None = None
        self.grant: DirectGrant | None = None
        # The stream broke (ended, or sent nothing within the read timeout) rather than answered: what a resume is for.
        self.broken = False

    @classmethod
    async def open(cls, grant: DirectGrant, descriptor: bytes, read_timeout: float) -> "DirectFrameStream":
        """Connect, send the ticketed kv-get and read its reply line (an error reply raises its S3Error)."""
        loop = asyncio.get_running_loop()
        host, _, port = grant.endpoint.rpartition(":")
        try:
            infos = await loop.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
            family, kind, proto, _, addr = infos[0]
            sock = socket.socket(family, kind, proto)
        except (OSError, ValueError) as e:
            raise _unreachable(grant.endpoint, e) from None
        stream = None
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await asyncio.wait_for(loop.sock_connect(sock, addr), CONNECT_TIMEOUT_S)
            # A peer's stream is given up after the grant's stall bound (the client resumes through its own node).
            stream = cls(sock, min(read_timeout, grant.stall_s) if grant.peer and grant.stall_s > 0 else read_timeout)
            stream.grant = grant
            await loop.sock_sendall(sock, RpcRequest(Op.KV_GET, {"ticket": grant.ticket}, len(descriptor)).encode() + descriptor)
            stream.accepted = KVGetAccepted.from_json(decode_reply(await stream._read_line()))
            return stream
        except (OSError, asyncio.TimeoutError) as e:
            stream.close() if stream is not None else sock.close()
            raise _unreachable(grant.endpoint, e) from None
        except BaseException:
            stream.close() if stream is not None else sock.close()
            raise

    def detach(self) -> socket.socket | None:
        """The socket, for another request, if this stream ended at a frame boundary with nothing unread (else None:
        closed); the stream is not used again."""
        if self._pending or self._eof or self.broken or self._sock.fileno() < 0:
            self.close()
            return None
        self._unwatch()
        return self._sock

    def close(self) -> None:
        self._unwatch()
        self._sock.close()

    def _unwatch(self) -> None:
        """The socket's reader off the loop it was registered with (and the read timeout's timer cancelled)."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        loop, self._watching = self._watching, None
        if loop is not None and not loop.is_closed() and self._sock.fileno() >= 0:
            loop.remove_reader(self._sock.fileno())

    async def _readable(self, deadline: float | None) -> None:
        """Until the socket has bytes; TimeoutError if none came by ``deadline`` (loop time; None: no deadline).

        The reader stays registered while each wait begins before the next bytes arrive (a layer stream: one wait per
        LAYER frame), and is removed when bytes arrive that nobody waits for (no busy loop while the caller computes):
        asyncio's ``sock_recv_into`` added and removed it on every wait, two ``epoll_ctl`` and the selector's
        bookkeeping per layer (py-spy, shm G64x64: a quarter of the client's loop).

        The deadline is one timer per stream, not one per wait: it fires at the deadline it was set for, and when the
        wait in progress began later (a later deadline) it is set again for that one. An ``asyncio.timeout`` per wait
        scheduled and cancelled a timer for every LAYER frame (cProfile, shm G64x64: a fifth of the client's time
        reading a stream)."""
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        self._deadline = deadline
        if self._watchdog is None and deadline is not None:
            self._watchdog = loop.call_at(deadline, self._on_deadline)
        if self._watching is None:
            loop.add_reader(self._sock.fileno(), self._on_readable)
            self._watching = loop
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _on_deadline(self) -> None:
        waiter, self._watchdog = self._waiter, None
        if waiter is None or waiter.done() or self._deadline is None:
            return  # no wait in progress (or none with a deadline): the next one sets the timer again
        loop = asyncio.get_running_loop()
        if loop.time() < self._deadline:
            self._watchdog = loop.call_at(self._deadline, self._on_deadline)
        else:
            waiter.set_exception(TimeoutError())

    def _on_readable(self) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            if self._watching is not None:
                self._watching.remove_reader(self._sock.fileno())
                self._watching = None
            return
        waiter.set_result(None)

    async def _recv_into(self, view: memoryview) -> int:
        """Bytes received into ``view`` (0 at the end of the stream): at once when some are waiting, else after a wait."""
        if self._pending:
            n = min(len(view), len(self._pending))
            view[:n] = self._pending[:n]
            self._pending = self._pending[n:]
            return n
        try:  # bytes already waiting (frames the server wrote while this process handled the last one): no deadline to set up
            return self._sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            return 0
        deadline = None if self._timeout is None else asyncio.get_running_loop().time() + self._timeout
        try:
            while True:
                await self._readable(deadline)
                try:
                    return self._sock.recv_into(view)
                except (BlockingIOError, InterruptedError):
                    pass
        except TimeoutError:
            self.broken = True
            bound = "the peer's stall bound" if self.grant is not None and self.grant.peer and self._timeout == self.grant.stall_s else "read_timeout"
            raise S3Error(ErrorCode.RequestTimeout, f"the KV stream sent nothing within {self._timeout:g} s ({bound})") from None
        except OSError:
            return 0

    async def _read_line(self) -> bytes:
        buf = bytearray()
        chunk = memoryview(bytearray(64 << 10))
        while (end := buf.find(b"\n")) < 0:
            if len(buf) > MAX_REQUEST_LINE:
                raise S3Error(ErrorCode.InternalError, "the data endpoint's reply line is too long")
            n = await self._recv_into(chunk)
            if not n:
                self.closed_unanswered = True
                raise S3Error(ErrorCode.ServiceUnavailable, "The data endpoint closed the connection before answering.")
            buf += chunk[:n]
        self._pending = memoryview(bytes(buf[end + 1 :]))
        return bytes(buf[: end + 1])

    async def read_into(self, dest: memoryview, n: int, received: Callable[[memoryview], None] | None = None) -> None:
        """``n`` bytes into ``dest``; ``received`` sees each part as soon as it is in (to checksum it while cached)."""
        pos = 0
        while pos < n:
            got = await self._recv_into(dest[pos:n])
            if not got:
                self._eof = self.broken = True
                raise S3Error(ErrorCode.ServiceUnavailable, "The KV stream ended in the middle of a frame (the storage server went away).")
            if received is not None:
                received(dest[pos : pos + got])
            pos += got

    async def _read_exact(self, n: int) -> bytes:
        out = bytearray(n)
        await self.read_into(memoryview(out), n)
        return bytes(out)

    async def next_frame(self) -> Frame | None:
        """The next frame header. A receive takes up to ``FRAME_BURST`` bytes: the frames the server wrote meanwhile
        (shm: LAYER frames, no payload) are parsed from it with no further syscall or wait. Payload bytes it took are
        handed to the payload's reader first (``_pending``); the buffer is reused only once they are consumed."""
        if not self._pending:
            got = await self._recv_into(self._burst)
            if not got:
                self.broken = True  # a stream ends after its END or ERROR frame, which the reader does not read past
                return None
            self._pending = self._burst[:got]
        if len(self._pending) >= FRAME_SIZE:
            frame = unpack_frame(self._pending[:FRAME_SIZE])
            self._pending = self._pending[FRAME_SIZE:]
            return frame
        head = bytearray(FRAME_SIZE)
        got = await self._recv_into(memoryview(head))  # the partial header that was pending
        await self.read_into(memoryview(head)[got:], FRAME_SIZE - got)
        return unpack_frame(bytes(head))

    async def read_payload(self, n: int) -> bytearray:
        """A frame's ``n`` payload bytes, in a buffer of their own (an ENCODED slice, kept until it is decoded)."""
        buf = bytearray(n)
        await self.read_into(memoryview(buf), n)
        return buf

    async def read_json(self, frame: Frame) -> dict:
        return json.loads(await self._read_exact(frame.length))


def _unreachable(endpoint: str, e: BaseException) -> S3Error:
    return S3Error(ErrorCode.ServiceUnavailable, f"the storage server's data endpoint {endpoint} is not reachable ({type(e).__name__}: {e})")
