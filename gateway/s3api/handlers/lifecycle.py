"""Bucket lifecycle operations: Get/PutBucketLifecycleConfiguration, DeleteBucketLifecycle (the
``AbortIncompleteMultipartUpload`` subset, see :mod:`gateway.s3api.lifecycle_xml`)."""

from __future__ import annotations

from aiohttp import web

from protocol.errors import ErrorCode, S3Error

from .. import xml
from ..context import S3Request
from ..lifecycle_xml import lifecycle_nodes, parse_lifecycle
from .common import empty, xml_response


async def get_bucket_lifecycle(req: S3Request) -> web.Response:
    info = await req.owned_bucket()
    if not info.lifecycle:
        raise S3Error(ErrorCode.NoSuchLifecycleConfiguration, resource=f"/{req.bucket}", extra={"BucketName": req.bucket})
    return xml_response("LifecycleConfiguration", lifecycle_nodes(info.lifecycle))


async def put_bucket_lifecycle(req: S3Request) -> web.Response:
    await req.owned_bucket()
    await req.store.set_bucket_lifecycle(req.bucket, parse_lifecycle(await req.body_bytes(xml.MAX_REQUEST_XML)))
    return empty()


async def delete_bucket_lifecycle(req: S3Request) -> web.Response:
    await req.owned_bucket()
    await req.store.set_bucket_lifecycle(req.bucket, ())
    return empty(204)
