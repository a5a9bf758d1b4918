"""The request pipeline around every operation: request id, S3 error bodies, per-operation hooks.

Middlewares run outermost first (:data:`MIDDLEWARES`): the request id exists
before anything can fail, the hooks see the status of the response the client
gets (error responses included), and errors become S3 XML in one place.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from protocol.errors import ErrorCode, S3Error, storage_full

from .s3api import xml
from .s3api.context import Address

log = logging.getLogger("objectcache.gateway")

UNKNOWN_OPERATION = "Unknown"  # the request failed before routing (e.g. authentication)
CLIENT_CLOSED = 499  # hook status of a request whose connection went away (nginx's "client closed request")



@dataclass
class RequestState:
    """What the pipeline learns about a request as it goes (stored on it under :data:`STATE`)."""

    request_id: str
    addr: Address | None = None  # once parsed: errors name their resource from it
    operation: str = UNKNOWN_OPERATION  # the matched route's
    tenant: str | None = None  # once authenticated


STATE = web.RequestKey("objectcache", RequestState)


def state(request: web.Request) -> RequestState:
    return request[STATE]


@dataclass(frozen=True)
class OperationRecord:
    """One finished request, as the per-operation hooks see it.

    ``bytes_in`` is the request body received; ``bytes_out`` the body of a
    buffered response, or, for a response the handler streamed itself, the
    bytes written to the connection (headers and chunk framing included).
    """

    operation: str
    status: int
    duration_s: float
    bytes_in: int
    bytes_out: int
    request_id: str
    tenant: str | None
    bucket: str | None = None


OperationHook = Callable[[OperationRecord], None]
OPERATION_HOOKS = web.AppKey("operation_hooks", list[OperationHook])

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def new_request_id() -> str:
    return secrets.token_hex(8).upper()


def error_response(err: S3Error, request_id: str, method: str) -> web.Response:
    headers = {**err.headers, "x-amz-request-id": request_id}
    if err.code is ErrorCode.NotModified:
        return web.Response(status=304, headers=headers)
    body = None if method == "HEAD" else xml.error_document(err, request_id)
    return web.Response(status=err.status, body=body, content_type="application/xml", headers=headers)


@web.middleware
async def request_id(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Name the request before anything else runs; :func:`stamp_response` puts the name on the response."""
    request[STATE] = RequestState(new_request_id())
    return await handler(request)


async def stamp_response(request: web.Request, response: web.StreamResponse) -> None:
    """Every response, streamed or not, carries the request id and server name (an ``on_response_prepare`` signal:
    a streamed response's headers are sent before its handler returns to a middleware)."""
    st: RequestState | None = request.get(STATE)
    if st is not None:
        response.headers.setdefault("x-amz-request-id", st.request_id)
        response.headers.setdefault("x-amz-id-2", st.request_id)
    response.headers["Server"] = "ObjectCache"


@web.middleware
async def operation_hooks(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Report every request to the app's :data:`OPERATION_HOOKS` once it completes (the metrics plug in here)."""
    hooks = request.app[OPERATION_HOOKS]
    if not hooks:
        return await handler(request)
    started = time.perf_counter()
    status, bytes_out = CLIENT_CLOSED, 0
    try:
        resp = await handler(request)
        status, bytes_out = resp.status, _bytes_out(request, resp)
        return resp
    finally:
        st = state(request)
        record = OperationRecord(st.operation, status, time.perf_counter() - started, request.content.total_bytes, bytes_out,
                                 st.request_id, st.tenant, st.addr.bucket if st.addr is not None else None)
        for hook in hooks:
            try:
                hook(record)
            except Exception:
                log.exception("operation hook %r failed (request %s)", hook, record.request_id)


def _bytes_out(request: web.Request, resp: web.StreamResponse) -> int:
    if resp.prepared:
        return resp.body_length
    body = resp.body if isinstance(resp, web.Response) and request.method != "HEAD" else None
    return len(body) if isinstance(body, (bytes, bytearray)) else 0


@web.middleware
async def s3_errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """S3Error → its XML body and status; anything unexpected → logged, 500 InternalError."""
    st = state(request)
    if "Content-Length" in request.headers and "Transfer-Encoding" in request.headers:
        # Two framings at once is how requests are smuggled past proxies: refuse, and end the connection.
        resp = error_response(S3Error(ErrorCode.InvalidRequest, "A request may not carry both Content-Length and Transfer-Encoding."),
                              st.request_id, request.method)
        resp.force_close()
        return resp
    try:
        return await handler(request)
    except S3Error as err:
        if not err.resource and st.addr is not None:
            err.resource = st.addr.resource
        return error_response(err, st.request_id, request.method)
    except (ConnectionError, asyncio.CancelledError):
        raise  # the client or a relayed stream went away: aiohttp closes the connection
    except Exception as e:
        full = storage_full(e)  # a full disk met where no layer mapped it is still 507, never a retried 500
        if full is not None:
            log.warning("disk full (request %s): %s", st.request_id, e)
            return error_response(full, st.request_id, request.method)
        log.exception("internal error (request %s)", st.request_id)
        return error_response(S3Error(ErrorCode.InternalError), st.request_id, request.method)


MIDDLEWARES = (request_id, operation_hooks, s3_errors)


def install(app: web.Application) -> None:
    """Add the pipeline to ``app``: middlewares, the response stamp and an empty hook list."""
    app.middlewares.extend(MIDDLEWARES)
    app.on_response_prepare.append(stamp_response)
    app[OPERATION_HOOKS] = []
