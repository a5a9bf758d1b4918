"""The gateway process: aiohttp application wiring auth, routing and errors."""

from __future__ import annotations

import asyncio
import logging
import secrets

from aiohttp import web

from protocol.config import Config
from protocol.errors import ErrorCode, S3Error
from storage_server.store import ObjectStore

from .auth.sigv4 import Credentials, RequestVerifier, parse_query
from .kv import handlers as kv_handlers
from .s3api import xml
from .s3api.context import S3Request
from .s3api.router import EXTENSIONS, address, route
from .storage_rpc import StorageServerClient

log = logging.getLogger("objectcache.gateway")

STORE_KEY = web.AppKey("store", ObjectStore)
CONFIG_KEY = web.AppKey("config", Config)


def new_request_id() -> str:
    return secrets.token_hex(8).upper()


def error_response(err: S3Error, request_id: str, method: str) -> web.Response:
    headers = {"x-amz-request-id": request_id}
    if err.code is ErrorCode.NotModified:
        return web.Response(status=304, headers=headers)
    body = None if method == "HEAD" else xml.error_document(err, request_id)
    return web.Response(status=err.status, body=body, content_type="application/xml", headers=headers)


class Gateway:
    """Holds the shared verifier and dispatches every request."""

    def __init__(self, config: Config, store: ObjectStore) -> None:
        self.config = config
        self.store = store
        by_key = {t.access_key: Credentials(t.access_key, t.secret_key, t.name) for t in config.tenants}
        self.verifier = RequestVerifier(by_key.get, max_skew_s=config.gateway.max_clock_skew_s)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        request_id = request["request_id"] = new_request_id()
        raw_path, _, raw_query = request.raw_path.partition("?")
        addr = None
        try:
            addr = address(raw_path, request.headers.get("Host", ""), self.config.gateway.domains)
            v2_resource = raw_path if addr.path_style else f"/{addr.bucket}{raw_path}"
            auth = self.verifier.verify(request.method, raw_path, raw_query, request.headers, v2_resource)
            query = dict(parse_query(raw_query))
            handler = route(request.method, addr, query)
            req = S3Request(request, request_id, auth, self.store, self.config.gateway, addr.bucket, addr.key, query)
            resp = await handler(req)
        except S3Error as err:
            if not err.resource and addr is not None:
                err.resource = "/" + "/".join(p for p in (addr.bucket, addr.key) if p)
            return error_response(err, request_id, request.method)
        except (ConnectionError, asyncio.CancelledError):
            raise  # the client or a relayed stream went away: aiohttp closes the connection
        except Exception:
            log.exception("internal error (request %s)", request_id)
            return error_response(S3Error(ErrorCode.InternalError), request_id, request.method)
        return resp


async def _stamp_response(request: web.Request, response: web.StreamResponse) -> None:
    """Every response, streamed or not, carries the request id and server name."""
    request_id = request.get("request_id")
    if request_id:
        response.headers.setdefault("x-amz-request-id", request_id)
        response.headers.setdefault("x-amz-id-2", request_id)
    response.headers["Server"] = "ObjectCache"


kv_handlers.register(EXTENSIONS)


def build_app(config: Config, store: ObjectStore) -> web.Application:
    gw = Gateway(config, store)
    app = web.Application(client_max_size=1024**3, handler_args={"max_field_size": 65536, "max_line_size": 65536, "auto_decompress": False})
    app[STORE_KEY] = store
    app[CONFIG_KEY] = config
    app[kv_handlers.RPC_KEY] = StorageServerClient(config)
    app.router.add_route("*", "/{tail:.*}", gw.handle)
    app.on_response_prepare.append(_stamp_response)

    async def close_store(_: web.Application) -> None:
        await store.close()

    app.on_cleanup.append(close_store)
    return app
