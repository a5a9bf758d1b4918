"""The gateway process: an aiohttp application whose one handler addresses, authenticates, routes and dispatches.

Request ids, S3 error bodies and per-operation hooks are middlewares
(:mod:`gateway.middleware`); which handler serves a request is the route
table's answer (:mod:`gateway.s3api.router`, with :mod:`gateway.kv.routes`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import HttpVersion11, web

from protocol.config import Config
from protocol.errors import ErrorCode, S3Error
from storage_server.store import ObjectStore

from . import access_log, middleware
from .auth.sigv4 import ANONYMOUS, Credentials, RequestVerifier, carries_credentials, parse_query
from .connections import GuardedListener
from .health import Health, is_probe
from .kv import handlers as kv_handlers
from .kv import routes as kv_routes
from .metrics import GatewayMetrics
from .s3api import router
from .s3api.context import Level, S3Request
from .storage_rpc import StorageServerClient

STORE_KEY = web.AppKey("store", ObjectStore)
CONFIG_KEY = web.AppKey("config", Config)
HEALTH_KEY = web.AppKey("health", Health)
METRICS_KEY = web.AppKey("metrics", GatewayMetrics)

# The KV table comes first: an extension's sub-resource selects it over the S3 operation at the same address.
log = logging.getLogger("objectcache.gateway")

ROUTER = router.Router(kv_routes.ROUTES, router.ROUTES)
REPORT_EVERY_S = 5.0  # how often a drain that still waits says so


class Gateway:
    """Holds the shared verifier and dispatches every request to its route's handler."""

    def __init__(self, config: Config, store: ObjectStore, health: Health) -> None:
        self.config = config
        self.store = store
        self.health = health
        by_key = {t.access_key: Credentials(t.access_key, t.secret_key, t.name, t.owner_id) for t in config.tenants}
        self.verifier = RequestVerifier(by_key.get, max_skew_s=config.gateway.max_clock_skew_s)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        st = middleware.state(request)
        if is_probe(request):  # before authentication: probes carry no credentials
            st.operation = "Health" if request.raw_path == "/health" else "Ready"
            return await self.health.answer(request)
        if self.health.draining:
            # A request on a kept-alive connection after the drain began: not started, retryable elsewhere.
            raise S3Error(ErrorCode.ServiceUnavailable, "The gateway is shutting down; retry (on another gateway or once it is back).")
        raw_path, _, raw_query = request.raw_path.partition("?")
        addr = st.addr = router.address(raw_path, request.headers.get("Host", ""), self.config.gateway.domains)
        v2_resource = raw_path if addr.path_style else f"/{addr.bucket}{raw_path}"
        if addr.level == Level.BUCKET and not v2_resource.endswith("/"):
            v2_resource += "/"  # SigV2 signs a bucket as "/bucket/" (botocore, s3cmd), also for path-style "/bucket"
        if request.method in ("GET", "HEAD") and addr.level == Level.OBJECT and not carries_credentials(request.headers, raw_query):
            auth = ANONYMOUS  # may read only what an object's ACL makes public (checked by the handler)
        else:
            auth = self.verifier.verify(request.method, raw_path, raw_query, request.headers, v2_resource)
        st.tenant = auth.tenant
        query = dict(parse_query(raw_query))
        route = ROUTER.match(request.method, addr.level, query, request.headers)
        st.operation = route.operation
        return await route.handler(S3Request(request, st.request_id, auth, self.store, self.config.gateway, addr, query))


async def expect_continue(request: web.Request) -> None:
    """``Expect: 100-continue`` gets its interim 100 before the handler reads the body; any other
    ``Expect`` value is ignored and the request proceeds.

    aiohttp's default handler answers 417 Expectation Failed to any other value. S3 does not: it
    ignores expectations it does not know on PUT (Ceph's s3-tests check this with ``Expect: 200``
    and an empty ``Expect``), and no S3 operation answers 417, so neither does this gateway.
    """
    if request.version == HttpVersion11 and request.headers.get("Expect", "").strip().lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the interim response is not part of the response body's count


def build_app(config: Config, store: ObjectStore) -> web.Application:
    rpc = StorageServerClient(config)
    health = Health(store, rpc)
    gw = Gateway(config, store, health)
    app = web.Application(client_max_size=1024**3, handler_args={"max_field_size": 65536, "max_line_size": 65536, "auto_decompress": False})
    middleware.install(app)
    app.on_response_prepare.append(close_when_draining)
    app[STORE_KEY] = store
    app[CONFIG_KEY] = config
    app[kv_handlers.RPC_KEY] = rpc
    app[HEALTH_KEY] = health
    app[METRICS_KEY] = metrics = GatewayMetrics()
    app[middleware.OPERATION_HOOKS].extend((metrics.observe, access_log.log_request))
    # [\s\S], not ".": a key may hold a newline (%0A), and "." stops there (aiohttp would answer 404 itself).
    app.router.add_route("*", r"/{tail:[\s\S]*}", gw.handle, expect_handler=expect_continue)

    async def close_store(_: web.Application) -> None:
        await store.close()

    app.on_cleanup.append(close_store)
    return app


async def start_gateway(config: Config, store: ObjectStore, host: str | None = None, port: int | None = None,
                        say: Callable[[str], None] = lambda line: None) -> tuple[int, Callable[[], Awaitable[None]]]:
    """Serve the gateway on ``host:port`` (the config's by default) with the connection guards, and its metrics
    listener when configured; the port and a stop function that drains (see :func:`drain`, which tells ``say``
    what it waits for)."""
    gw = config.gateway
    app = build_app(config, store)
    # handler_cancellation: a client that disconnects cancels its handler at once,
    # which closes the relayed storage-server stream and stops the transfer.
    # shutdown_timeout: how long requests in flight may finish once the listener closed.
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=gw.drain_timeout_s)
    await runner.setup()
    listener = GuardedListener(runner, gw.host if host is None else host, gw.port if port is None else port,
                               header_timeout_s=gw.header_timeout_s, max_connections=gw.max_connections)
    try:
        bound = await listener.start()
    except BaseException:
        await runner.cleanup()  # e.g. the port is in use: release what setup() built
        raise
    m = config.metrics
    stop_metrics = await app[METRICS_KEY].listen(m.host, m.gateway_port) if m.gateway_port else None

    async def stop() -> None:
        await drain(app, listener, runner, say)
        if stop_metrics is not None:
            await stop_metrics()

    return bound, stop


def _in_flight(runner: web.AppRunner) -> list[str]:
    """``METHOD /path`` of each request being handled (no query: it may carry a presigned signature)."""
    conns = runner.server.connections if runner.server else []
    return [f"{r.method} {r.path}" for r in (c._current_request for c in conns) if r is not None]


async def drain(app: web.Application, listener: GuardedListener, runner: web.AppRunner,
                say: Callable[[str], None] = lambda line: None) -> None:
    """Shut down gracefully: ``/ready`` turns 503 first, then the listener closes (new connections are
    refused, idle keep-alive ones closed) and requests in flight get ``gateway.drain_timeout_s`` to finish.

    From the moment draining starts every response says ``Connection: close`` and a request that
    arrives on a kept-alive connection is answered ``503`` without running (:meth:`Gateway.handle`):
    a client that keeps its connection open cannot keep feeding a stopping gateway new work.
    ``say`` gets a line naming what the drain waits for, again every few seconds while it waits.
    """
    app[HEALTH_KEY].draining = True
    app[METRICS_KEY].draining.set(1)
    timeout = app[CONFIG_KEY].gateway.drain_timeout_s
    waiting = _in_flight(runner)
    log.info("draining: %d request(s) in flight, up to %g s", len(waiting), timeout)
    if waiting:
        say(f"gateway draining: waiting up to {timeout:g} s for {len(waiting)} request(s) in flight: {', '.join(waiting[:5])}"
            + (" …" if len(waiting) > 5 else ""))
    await listener.stop()
    # Let responses in flight finish and their last bytes leave the socket buffers before connections close.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    next_report = loop.time() + REPORT_EVERY_S
    while loop.time() < deadline and any(
            c._current_request is not None or (c.transport is not None and c.transport.get_write_buffer_size())
            for c in (runner.server.connections if runner.server else [])):
        if loop.time() >= next_report:
            waiting, next_report = _in_flight(runner), loop.time() + REPORT_EVERY_S
            say(f"gateway draining: still waiting for {len(waiting)} request(s), {deadline - loop.time():.0f} s left: "
                + ", ".join(waiting[:5]))
        await asyncio.sleep(0.05)
    left = _in_flight(runner)
    if left:
        say(f"gateway drain timeout: cutting {len(left)} request(s): {', '.join(left[:5])}")
    await runner.cleanup()


async def close_when_draining(request: web.Request, response: web.StreamResponse) -> None:
    """While draining, every response ends its connection: ``Connection: close`` said (aiohttp has
    written its header list by the time this signal runs) and done (the protocol reads ``keep_alive``)."""
    if request.app[HEALTH_KEY].draining:
        response.force_close()
        response.headers["Connection"] = "close"
