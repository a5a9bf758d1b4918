"""The gateway process: an aiohttp application whose one handler addresses, authenticates, routes and dispatches.

Request ids, S3 error bodies and per-operation hooks are middlewares
(:mod:`gateway.middleware`); which handler serves a request is the route
table's answer (:mod:`gateway.s3api.router`, with :mod:`gateway.kv.routes`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from protocol.config import Config
from storage_server.store import ObjectStore

from . import middleware
from .auth.sigv4 import Credentials, RequestVerifier, parse_query
from .connections import GuardedListener
from .kv import handlers as kv_handlers
from .kv import routes as kv_routes
from .s3api import router
from .s3api.context import S3Request
from .storage_rpc import StorageServerClient

STORE_KEY = web.AppKey("store", ObjectStore)
CONFIG_KEY = web.AppKey("config", Config)

# The KV table comes first: an extension's sub-resource selects it over the S3 operation at the same address.
ROUTER = router.Router(kv_routes.ROUTES, router.ROUTES)


class Gateway:
    """Holds the shared verifier and dispatches every request to its route's handler."""

    def __init__(self, config: Config, store: ObjectStore) -> None:
        self.config = config
        self.store = store
        by_key = {t.access_key: Credentials(t.access_key, t.secret_key, t.name) for t in config.tenants}
        self.verifier = RequestVerifier(by_key.get, max_skew_s=config.gateway.max_clock_skew_s)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        st = middleware.state(request)
        raw_path, _, raw_query = request.raw_path.partition("?")
        addr = st.addr = router.address(raw_path, request.headers.get("Host", ""), self.config.gateway.domains)
        v2_resource = raw_path if addr.path_style else f"/{addr.bucket}{raw_path}"
        auth = self.verifier.verify(request.method, raw_path, raw_query, request.headers, v2_resource)
        st.tenant = auth.tenant
        query = dict(parse_query(raw_query))
        route = ROUTER.match(request.method, addr.level, query, request.headers)
        st.operation = route.operation
        return await route.handler(S3Request(request, st.request_id, auth, self.store, self.config.gateway, addr, query))


def build_app(config: Config, store: ObjectStore) -> web.Application:
    gw = Gateway(config, store)
    app = web.Application(client_max_size=1024**3, handler_args={"max_field_size": 65536, "max_line_size": 65536, "auto_decompress": False})
    middleware.install(app)
    app[STORE_KEY] = store
    app[CONFIG_KEY] = config
    app[kv_handlers.RPC_KEY] = StorageServerClient(config)
    app.router.add_route("*", "/{tail:.*}", gw.handle)

    async def close_store(_: web.Application) -> None:
        await store.close()

    app.on_cleanup.append(close_store)
    return app


async def start_gateway(config: Config, store: ObjectStore, host: str | None = None, port: int | None = None) -> tuple[int, Callable[[], Awaitable[None]]]:
    """Serve the gateway on ``host:port`` (the config's by default) with the connection guards; the port and a stop function."""
    # handler_cancellation: a client that disconnects cancels its handler at once,
    # which closes the relayed storage-server stream and stops the transfer.
    runner = web.AppRunner(build_app(config, store), access_log=None, handler_cancellation=True)
    await runner.setup()
    gw = config.gateway
    listener = GuardedListener(runner, gw.host if host is None else host, gw.port if port is None else port,
                               header_timeout_s=gw.header_timeout_s, max_connections=gw.max_connections)
    try:
        bound = await listener.start()
    except BaseException:
        await runner.cleanup()  # e.g. the port is in use: release what setup() built
        raise

    async def stop() -> None:
        await listener.stop()
        await runner.cleanup()

    return bound, stop
