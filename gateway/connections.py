"""Client connections are bounded in number and in how long they may hold a slot without a request.

aiohttp has no deadline for a request's headers: a client that trickles header
bytes, or opens a connection and sends nothing, keeps its slot (and its file
descriptor) for ever. :class:`ConnectionGuard` closes any connection that has
gone ``header_timeout_s`` without a request in progress (counted from the
connection or the previous response), and :class:`GuardedSite` answers
``503`` and closes connections beyond ``max_connections``. Body reads have
their own silence limit (:mod:`gateway.auth.payload`). Slow clients are shed;
well-behaved ones keep being served.
"""

from __future__ import annotations

import asyncio
import resource
import typing
from collections.abc import Callable

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from protocol.errors import ErrorCode, S3Error

from .s3api import xml


def _refusal() -> bytes:
    body = xml.error_document(S3Error(ErrorCode.ServiceUnavailable, "Too many connections; retry shortly."), "")
    head = f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


REFUSAL = _refusal()


def connection_limit(configured: int) -> int:
    """The configured cap, kept below half the process's file-descriptor limit."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return max(1, min(configured, soft // 2)) if soft > 0 else configured


class _Refuse(asyncio.Protocol):
    """Answers one 503 and closes: what a connection beyond the cap gets."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        typing.cast(asyncio.WriteTransport, transport).write(REFUSAL)
        transport.close()


class GuardedSite(web.TCPSite):
    """A TCP site whose protocol factory refuses connections beyond the cap."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, max_connections: int, **kwargs) -> None:
        super().__init__(runner, host, port, **kwargs)
        self.max_connections = connection_limit(max_connections)

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None

        def factory() -> asyncio.Protocol:
            if len(server.connections) >= self.max_connections:
                return _Refuse()
            return server()

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(factory, self._host, self._port, reuse_address=self._reuse_address,
                                                reuse_port=self._reuse_port, backlog=self._backlog)


class ConnectionGuard:
    """Closes connections that sat ``header_timeout_s`` without a request in progress."""

    def __init__(self, connections: Callable[[], list[RequestHandler]], header_timeout_s: float, clock: Callable[[], float]) -> None:
        self._connections = connections
        self.header_timeout_s = header_timeout_s
        self._clock = clock
        self._waiting_since: dict[RequestHandler, float] = {}
        self.closed = 0

    def sweep(self) -> int:
        """One round: close the connections past their deadline; how many."""
        now = self._clock()
        alive = set(self._connections())
        waiting: dict[RequestHandler, float] = {}
        doomed = []
        for handler in alive:
            if handler._current_request is not None:  # a request is being served: not waiting for headers
                continue
            since = self._waiting_since.get(handler, now)
            waiting[handler] = since
            if now - since >= self.header_timeout_s:
                doomed.append(handler)
        self._waiting_since = waiting
        for handler in doomed:
            handler.force_close()
            if handler.transport is not None:
                handler.transport.close()
        self.closed += len(doomed)
        return len(doomed)

    async def run(self) -> None:
        period = min(1.0, self.header_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            self.sweep()


class GuardedListener:
    """The gateway's listening socket with both guards, for a set-up ``runner``."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, *, header_timeout_s: float, max_connections: int) -> None:
        self.site = GuardedSite(runner, host, port, max_connections, reuse_address=True)
        self.runner = runner
        self.header_timeout_s = header_timeout_s
        self._task: asyncio.Task | None = None

    async def start(self) -> int:
        """Listen; the port (useful with port 0)."""
        await self.site.start()
        server = self.runner.server
        assert server is not None
        guard = ConnectionGuard(lambda: list(server.connections), self.header_timeout_s, asyncio.get_running_loop().time)
        self._task = asyncio.ensure_future(guard.run())
        return self.runner.addresses[0][1]

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.site.stop()
