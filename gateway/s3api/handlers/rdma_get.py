"""GetObject with ``x-amz-rdma-token``: the object lands in the client's registered memory, the response has no body.

The S3-over-RDMA convention (:mod:`protocol.rdma_token`): a GET that proposes RDMA carries
``x-amz-rdma-token``; served that way, the response is the object's usual headers with an empty
body, ``x-amz-rdma-reply: 200`` and ``x-amz-rdma-bytes-transferred``; declined, it is ``501
NotImplemented`` with ``x-amz-rdma-reply: 501`` and the client GETs the object plainly. This
gateway authorizes the request and evaluates its conditions as for any GET; the storage server,
which holds the registrations and the RDMA engine, writes the bytes (``rdma-get-object``).
"""

from __future__ import annotations

from aiohttp import web

from protocol.errors import ErrorCode, S3Error
from protocol.rdma_token import HEADER_RDMA_BYTES, HEADER_RDMA_REPLY, HEADER_RDMA_TOKEN, REPLY_DECLINED, REPLY_OK, RdmaToken
from protocol.rpc import Op

from ...kv.handlers import rpc
from ..context import S3Request
from ..meta_encoding import MetadataResponse


def _declined(err: S3Error) -> S3Error:
    if err.code is ErrorCode.NotImplemented:
        err.headers[HEADER_RDMA_REPLY] = REPLY_DECLINED
    return err


async def rdma_get_object(req: S3Request, plan) -> web.Response:
    """``plan(meta)`` is GetObject's (range, status, headers) for the object's metadata."""
    token_text = req.headers[HEADER_RDMA_TOKEN]
    RdmaToken.parse(token_text)  # a malformed token is the client's error (400), before any work
    if "Range" in req.headers or "partNumber" in req.query:
        raise _declined(S3Error(ErrorCode.NotImplemented, "x-amz-rdma-token declined: it is served for GETs of whole objects, "
                                "not with Range or partNumber; GET the object without it", extra={"Header": HEADER_RDMA_TOKEN}))
    bucket = await req.readable_bucket()
    meta = await req.readable(req.store.head_object(req.bucket, req.key_checked()), bucket)
    req.check_read(meta, bucket)
    _, status, headers = plan(meta)
    try:
        reply = await rpc(req).call(Op.RDMA_GET_OBJECT, tenant=req.tenant, bucket=req.bucket, key=req.key_checked(),
                                    etag=meta.etag, token=token_text)
    except S3Error as e:
        raise _declined(e) from None
    headers.update({"Content-Length": "0", HEADER_RDMA_REPLY: REPLY_OK, HEADER_RDMA_BYTES: str(int(reply["bytes"]))})
    return MetadataResponse(status=status, headers=headers)
