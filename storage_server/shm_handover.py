"""The hand-over socket: where a client on this host gives the storage server the memory of an ``shm`` region.

One connection carries one registration: the ticket from ``kv-register`` as the
message and the sealed memfd attached (``SCM_RIGHTS``); the answer is one JSON
line (:mod:`protocol.rpc` reply encoding). The socket is world-connectable on
purpose (a serving process may run as another user): the ticket, handed out
only over the signed HTTP API, is what names the tenant.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from protocol.errors import ErrorCode, S3Error
from protocol.kv_http import RegisterReply
from protocol.rpc import encode_error, encode_reply
from protocol.shm import TICKET_BYTES, populate

from .regions import RegionRegistry

log = logging.getLogger("objectcache.storage_server.shm")

RECEIVE_TIMEOUT_S = 5.0


class HandoverServer:
    def __init__(self, regions: RegionRegistry, path: str) -> None:
        self.regions = regions
        self.path = path
        self._sock: socket.socket | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        if os.path.exists(self.path):
            os.unlink(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.path)
        os.chmod(self.path, 0o666)
        sock.listen(64)
        sock.setblocking(False)
        self._sock = sock
        self._task = asyncio.ensure_future(self._accept_loop())

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            conn, _ = await loop.sock_accept(self._sock)
            asyncio.ensure_future(self._serve(conn))

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        fds: list[int] = []
        try:
            conn.setblocking(False)
            try:
                secret, fds = await asyncio.wait_for(_receive(conn), RECEIVE_TIMEOUT_S)
                if len(secret) != TICKET_BYTES or len(fds) != 1:
                    raise S3Error(ErrorCode.InvalidRequest, f"a hand-over is a {TICKET_BYTES}-byte ticket with exactly one memfd attached")
                region = self.regions.complete(secret, fds[0])
                if region.populate:
                    # Fault in the whole mapping now (a worker thread, the GIL released), so the
                    # client's first transfer into it takes no page faults here.
                    region.hold()
                    try:
                        await asyncio.to_thread(populate, region.mm, region.size)
                    finally:
                        region.release()
                reply = encode_reply(RegisterReply(region.region_id.hex(), region.token.hex(), region.size).to_json())
            except S3Error as e:
                reply = encode_error(e)
            except asyncio.TimeoutError:
                reply = encode_error(S3Error(ErrorCode.RequestTimeout, "no ticket arrived on the hand-over socket in time"))
            except (OSError, MemoryError) as e:  # the region could not be set up here (e.g. populating it): say so
                log.warning("shm hand-over failed: %s", e)
                reply = encode_error(S3Error(ErrorCode.ServiceUnavailable, f"the storage server could not take the region "
                                             f"({e.__class__.__name__}: {e}); retry later or register a smaller one"))
            except Exception as e:  # a bug: still an answer, never a silently closed socket
                log.exception("shm hand-over failed")
                reply = encode_error(S3Error(ErrorCode.InternalError, f"shm hand-over failed: {e.__class__.__name__}"))
            await loop.sock_sendall(conn, reply)
        except OSError as e:
            log.info("shm hand-over connection failed: %s", e)
        except Exception:
            log.exception("shm hand-over failed")
        finally:
            for fd in fds:
                os.close(fd)  # the region keeps its own mapping
            conn.close()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._sock is not None:
            self._sock.close()
            if os.path.exists(self.path):
                os.unlink(self.path)


async def _receive(conn: socket.socket) -> tuple[bytes, list[int]]:
    """One message with its attached descriptors (asyncio has no recvmsg: wait for readability, then read)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[tuple[bytes, list[int]]] = loop.create_future()

    def readable() -> None:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(conn, TICKET_BYTES, maxfds=4)
        except BlockingIOError:
            return
        except OSError as e:
            if not done.done():
                done.set_exception(e)
            return
        if not done.done():
            done.set_result((msg, fds))
        else:
            for fd in fds:
                os.close(fd)

    loop.add_reader(conn.fileno(), readable)
    try:
        return await done
    finally:
        loop.remove_reader(conn.fileno())
