"""KV extensions: one handler per operation, beside the S3 operations.

* ``POST /{bucket}?kv-lookup`` — how many leading keys of a list exist (one request).
* ``POST /{bucket}?kv-put``    — store many immutable chunk objects (one request).
* ``POST /{bucket}?kv-get``    — forward a descriptor to the storage server and relay its frames
  (or, asked with ``x-oc-direct`` and with a data endpoint configured, answer with a ticket for it).
* ``POST /{bucket}?kv-estimate`` — the delivery-time oracle: per candidate host, warm chunks, path and predicted
  times (:mod:`protocol.estimate`), answered by the storage server of a cluster node.
* ``POST /?kv-register`` / ``POST /?kv-unregister`` — shared-memory regions for the ``shm`` transport.
* ``POST /{bucket}?kv-session`` — a session of the local fast path (:mod:`protocol.session`): kv-gets from this host
  then go to the storage server's session socket.

The gateway authenticates, authorises and validates; the storage server, which
owns the chunk store and its capacity, executes. Bodies, headers and frames are
defined in :mod:`protocol`; the requests that select each handler are rows in
:mod:`gateway.kv.routes`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import web

from protocol.compressed_chunk import HEADER_KV_LAYOUT, ChunkShape
from protocol.data_ticket import GRANT_CONTENT_TYPE, HEADER_DIRECT, DirectGrant
from protocol.errors import ErrorCode, S3Error
from protocol.estimate import MAX_ESTIMATE_BODY, EstimateReply, EstimateRequest
from protocol.kv_http import (
    FRAMES_CONTENT_TYPE,
    HEADER_GATEWAY_S,
    HEADER_LOAD_BUDGET,
    HEADER_MODE,
    HEADER_PAYLOAD_BYTES,
    HEADER_RDMA_TAG,
    HEADER_SOFT_PIN_TTL,
    MAX_JSON_BODY,
    LoadBudget,
    LookupReply,
    PutReply,
    RdmaRegisterRequest,
    RegisterReply,
    RegisterRequest,
    RegisterTicket,
    UnregisterRequest,
)
from protocol.rpc import KVGetAccepted, Op
from protocol.session import SessionTicket
from protocol.wire import FRAME_SIZE, MAX_DESCRIPTOR_BYTES, FrameType, TransportKind, decode_descriptor, descriptor_transport, json_frame, unpack_frame

from ..s3api.context import S3Request
from ..storage_rpc import StorageServerClient

RELAY_PIECE = 1 << 20

RPC_KEY = web.AppKey("storage_rpc", StorageServerClient)
log = logging.getLogger(__name__)


def json_response(obj: dict, status: int = 200) -> web.Response:
    return web.json_response(obj, status=status)


def rpc(req: S3Request) -> StorageServerClient:
    return req.http.app[RPC_KEY]


async def kv_lookup(req: S3Request) -> web.Response:
    await req.owned_bucket()
    body = await req.body_bytes(MAX_DESCRIPTOR_BYTES)
    budget = req.http.headers.get(HEADER_LOAD_BUDGET)  # "how much lands within it?": checked here, answered by the storage server
    fields = {} if budget is None else {"load_budget": LoadBudget.from_header(budget).to_header()}
    reply = await rpc(req).call(Op.KV_LOOKUP, body, tenant=req.tenant, bucket=req.bucket, **fields)
    return json_response(LookupReply.from_json(reply).to_json())


def _soft_pin_ttl(value: str) -> float:
    try:
        ttl = float(value)
    except ValueError:
        ttl = -1.0
    if not 0 < ttl < float("inf"):
        raise S3Error(ErrorCode.InvalidArgument, f"{HEADER_SOFT_PIN_TTL} must be a positive number of seconds, not {value!r}",
                      extra={"ArgumentName": HEADER_SOFT_PIN_TTL, "ArgumentValue": value})
    return ttl


async def kv_put(req: S3Request) -> web.Response:
    await req.owned_bucket()
    body = await req.body_bytes(req.config.kv_max_put_bytes)
    ttl = req.http.headers.get(HEADER_SOFT_PIN_TTL)
    fields: dict[str, object] = {} if ttl is None else {"soft_pin_s": _soft_pin_ttl(ttl)}
    shape = req.http.headers.get(HEADER_KV_LAYOUT)  # the chunks' shape, for a bucket whose codec the node applies
    if shape is not None:
        fields["kv_layout"] = ChunkShape.from_header(shape).to_header()
    reply = await rpc(req).call(Op.KV_PUT, body, tenant=req.tenant, bucket=req.bucket, **fields)
    return json_response(PutReply.from_json(reply).to_json())


async def kv_get(req: S3Request) -> web.StreamResponse:
    started = time.perf_counter()
    # On the first layer's path: the bucket check (a metadata query, on a thread) runs while the
    # descriptor arrives, and the storage server decodes the keys; here only the header routes it.
    owned = asyncio.ensure_future(req.owned_bucket())
    try:
        body = await req.body_bytes(MAX_DESCRIPTOR_BYTES)
    finally:
        bucket = (await asyncio.gather(owned, return_exceptions=True))[0]
        if isinstance(bucket, BaseException):
            raise bucket  # the bucket's error first, as when it was checked before the body
    transport = descriptor_transport(body)
    if transport is None:
        decode_descriptor(body)  # raises the error naming the field
    if transport == TransportKind.HTTP and req.http.headers.get(HEADER_DIRECT) == "1":
        grant = DirectGrant.from_json(await rpc(req).call(Op.KV_TICKET, body, tenant=req.tenant, bucket=req.bucket, request_id=req.request_id,
                                                          bucket_incarnation=bucket.incarnation))
        if grant.endpoint:  # else the storage server has no data endpoint: relay as usual
            return web.json_response(grant.to_json(), content_type=GRANT_CONTENT_TYPE,
                                     headers={HEADER_GATEWAY_S: f"{time.perf_counter() - started:.6f}"})
    reply, reader, writer = await rpc(req).open_stream(Op.KV_GET, body, tenant=req.tenant, bucket=req.bucket, request_id=req.request_id)
    try:
        accepted = KVGetAccepted.from_json(reply)
        resp = web.StreamResponse(headers={
            "Content-Type": FRAMES_CONTENT_TYPE,
            HEADER_MODE: accepted.mode,
            HEADER_PAYLOAD_BYTES: str(accepted.payload_bytes),
            HEADER_GATEWAY_S: f"{time.perf_counter() - started:.6f}",
        } | ({HEADER_RDMA_TAG: str(accepted.rdma_tag)} if accepted.rdma_tag else {}))
        await resp.prepare(req.http)
        try:
            await _relay_frames(reader, resp)
            await resp.write_eof()
        except ConnectionResetError:
            # The client left (or gave up on) the stream: an ordinary event, not a server error.
            # Closing the RPC stream below stops the transfer in the storage server.
            log.info("kv-get %s: client closed the stream before the transfer ended", req.request_id)
        return resp
    finally:
        writer.close()


async def kv_session(req: S3Request) -> web.Response:
    """The local fast path (:mod:`protocol.session`): a ticket to bind on the storage server's session socket, for the
    caller's own bucket (the incarnation checked here is the one the session will be good for)."""
    bucket = await req.owned_bucket()
    reply = await rpc(req).call(Op.KV_SESSION, b"", tenant=req.tenant, bucket=req.bucket, bucket_incarnation=bucket.incarnation)
    return json_response(SessionTicket.from_json(reply).to_json())


async def kv_estimate(req: S3Request) -> web.Response:
    """Only about the caller's own bucket: another tenant's is refused before anything is looked up."""
    try:
        await req.owned_bucket()
    except S3Error as e:
        if e.code is not ErrorCode.AccessDenied:
            raise
        raise S3Error(ErrorCode.AccessDenied, "kv-estimate answers only about the caller's own buckets", f"/{req.bucket}",
                      extra={"ArgumentName": "bucket"}) from None
    try:
        body = EstimateRequest.from_json(json.loads(await req.body_bytes(MAX_ESTIMATE_BODY) or b"null")).check()
    except ValueError:
        raise S3Error(ErrorCode.InvalidRequest, "The kv-estimate body must be a JSON object.") from None
    reply = await rpc(req).call(Op.KV_ESTIMATE, json.dumps(body.to_json()).encode(), tenant=req.tenant, bucket=req.bucket,
                                request_id=req.request_id)
    return json_response(EstimateReply.from_json(reply).to_json())


async def _relay_frames(reader, resp: web.StreamResponse) -> None:
    """Copy frames to the client.

    Failures writing to the client propagate (the transfer is abandoned and
    the storage server stops when its socket closes). If the storage server
    vanishes between frames, the client gets an ERROR frame saying so; if it
    vanishes inside a DATA payload, the response is cut (the client reports a
    truncated stream), since a frame cannot be inserted mid-payload.
    """
    lost = S3Error(ErrorCode.ServiceUnavailable, "The storage server stopped in the middle of the transfer.")
    while True:
        try:
            head = await reader.readexactly(FRAME_SIZE)
            frame = unpack_frame(head)
        except (EOFError, OSError):
            await resp.write(json_frame(FrameType.ERROR, lost.to_dict()))
            return
        except S3Error as e:
            await resp.write(json_frame(FrameType.ERROR, e.to_dict()))
            return
        await resp.write(head)
        remaining = frame.length if frame.has_payload else 0
        while remaining:
            try:
                piece = await reader.read(min(remaining, RELAY_PIECE))
            except OSError:
                piece = b""
            if not piece:
                raise ConnectionAbortedError("storage server lost inside a frame payload")
            await resp.write(piece)
            remaining -= len(piece)
        if frame.type in (FrameType.END, FrameType.ERROR):
            return


async def _json_body(req: S3Request) -> object:
    try:
        return json.loads(await req.body_bytes(MAX_JSON_BODY) or b"{}")
    except ValueError:
        raise S3Error(ErrorCode.InvalidRequest, "The request body must be a JSON object.") from None


async def kv_register(req: S3Request) -> web.Response:
    body = RegisterRequest.from_json(await _json_body(req))
    reply = await rpc(req).call(Op.KV_REGISTER, tenant=req.tenant, **body.to_json())
    return json_response(RegisterTicket.from_json(reply).to_json())


async def kv_register_rdma(req: S3Request) -> web.Response:
    body = RdmaRegisterRequest.from_json(await _json_body(req))
    reply = await rpc(req).call(Op.KV_REGISTER_RDMA, tenant=req.tenant, **body.to_json())
    return json_response(RegisterReply.from_json(reply).to_json())


async def kv_unregister(req: S3Request) -> web.Response:
    body = UnregisterRequest.from_json(await _json_body(req))
    await rpc(req).call(Op.KV_UNREGISTER, tenant=req.tenant, **body.to_json())
    return json_response({})


async def kv_status(req: S3Request) -> web.Response:
    """The caller's own transfers and regions (operators read the full status on the storage server's RPC)."""
    return json_response(await rpc(req).call(Op.STATUS, tenant=req.tenant))

