"""KV extensions: one handler per operation, registered into the S3 router's extension table.

* ``POST /{bucket}?kv-lookup`` — how many leading keys of a list exist (one request).
* ``POST /{bucket}?kv-put``    — store many immutable chunk objects (one request).
* ``POST /{bucket}?kv-get``    — forward a descriptor to the storage server and relay its frames.
* ``POST /?kv-register`` / ``POST /?kv-unregister`` — shared-memory regions for the ``shm`` transport.

The gateway authenticates, authorises and validates; the storage server
executes. Request bodies and frames are defined in ``storage_server.wire``.
"""

from __future__ import annotations

import json
import logging
import time

from aiohttp import web

from storage_server.backend import PutSpec
from storage_server.errors import ErrorCode, S3Error
from storage_server.wire import FRAME_SIZE, FrameType, decode_descriptor, decode_keys, decode_put_batch, json_frame, unpack_frame

from ..s3api.context import S3Request
from ..storage_rpc import StorageServerClient

KV_CONTENT_TYPE = "application/x-objectcache-kv-chunk"
FRAMES_CONTENT_TYPE = "application/x-objectcache-frames"
MAX_DESCRIPTOR_BYTES = 64 << 20
RELAY_PIECE = 1 << 20


def json_response(obj: dict, status: int = 200) -> web.Response:
    return web.json_response(obj, status=status)


def rpc(req: S3Request) -> StorageServerClient:
    return req.http.app[RPC_KEY]


RPC_KEY = web.AppKey("storage_rpc", StorageServerClient)
log = logging.getLogger(__name__)


async def kv_lookup(req: S3Request) -> web.Response:
    await req.owned_bucket()
    keys = decode_keys(await req.body_bytes(MAX_DESCRIPTOR_BYTES))
    found = await req.backend.locate(req.bucket, keys)  # type: ignore[arg-type]
    hits = next((i for i, loc in enumerate(found) if loc is None), len(found))
    return json_response({"hits": hits, "keys": len(keys)})


async def kv_put(req: S3Request) -> web.Response:
    await req.owned_bucket()
    items = decode_put_batch(await req.body_bytes(req.config.kv_max_put_bytes))
    spec = PutSpec(content_type=KV_CONTENT_TYPE, immutable=True)
    metas = await req.backend.put_many(req.bucket, [(k, data, spec) for k, data in items], req.tenant)  # type: ignore[arg-type]
    return json_response({"stored": len(metas), "etags": [m.etag for m in metas]})


async def kv_get(req: S3Request) -> web.StreamResponse:
    started = time.perf_counter()
    await req.owned_bucket()
    body = await req.body_bytes(MAX_DESCRIPTOR_BYTES)
    decode_descriptor(body)  # validate before forwarding: errors name the field
    header, reader, writer = await rpc(req).open_stream("kv-get", body, tenant=req.tenant, bucket=req.bucket, request_id=req.request_id)
    try:
        resp = web.StreamResponse(headers={
            "Content-Type": FRAMES_CONTENT_TYPE,
            "x-oc-mode": header["mode"],
            "x-oc-payload-bytes": str(header["payload_bytes"]),
            "x-oc-gateway-s": f"{time.perf_counter() - started:.6f}",
        })
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


async def _json_body(req: S3Request) -> dict:
    try:
        obj = json.loads(await req.body_bytes(64 * 1024) or b"{}")
    except ValueError:
        raise S3Error(ErrorCode.InvalidRequest, "The request body must be a JSON object.") from None
    if not isinstance(obj, dict):
        raise S3Error(ErrorCode.InvalidRequest, "The request body must be a JSON object.")
    return obj


async def kv_register(req: S3Request) -> web.Response:
    body = await _json_body(req)
    for f in ("name", "size", "nonce"):
        if f not in body:
            raise S3Error(ErrorCode.InvalidArgument, f"kv-register needs {f!r}", extra={"ArgumentName": f})
    reply = await rpc(req).call("kv-register", tenant=req.tenant, name=body["name"], size=body["size"], nonce=body["nonce"])
    return json_response({k: reply[k] for k in ("region_id", "token", "size")})


async def kv_unregister(req: S3Request) -> web.Response:
    body = await _json_body(req)
    await rpc(req).call("kv-unregister", tenant=req.tenant, region_id=body.get("region_id", ""), token=body.get("token", ""))
    return json_response({})


async def kv_status(req: S3Request) -> web.Response:
    return json_response(await rpc(req).call("status"))


def register(extensions: dict) -> None:
    """Plug the KV operations into the router's extension table."""
    extensions[("POST", "bucket", "kv-lookup")] = kv_lookup
    extensions[("POST", "bucket", "kv-put")] = kv_put
    extensions[("POST", "bucket", "kv-get")] = kv_get
    extensions[("POST", "service", "kv-register")] = kv_register
    extensions[("POST", "service", "kv-unregister")] = kv_unregister
    extensions[("GET", "service", "kv-status")] = kv_status
