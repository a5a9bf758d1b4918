"""Tagging operations: Get/Put/DeleteObjectTagging, Get/Put/DeleteBucketTagging."""

from __future__ import annotations

from aiohttp import web

from protocol.errors import ErrorCode, S3Error

from .. import xml
from ..access import MAX_BUCKET_TAGS, MAX_OBJECT_TAGS, parse_tagging, tagging_nodes
from ..context import S3Request
from .common import empty, xml_response


async def get_object_tagging(req: S3Request) -> web.Response:
    await req.owned_bucket()
    meta = await req.store.head_object(req.bucket, req.key_checked())
    return xml_response("Tagging", tagging_nodes(meta.tags))


async def put_object_tagging(req: S3Request) -> web.Response:
    await req.owned_bucket()
    tags = parse_tagging(await req.body_bytes(xml.MAX_REQUEST_XML), MAX_OBJECT_TAGS)
    await req.store.set_object_tags(req.bucket, req.key_checked(), tags)
    return empty()


async def delete_object_tagging(req: S3Request) -> web.Response:
    await req.owned_bucket()
    await req.store.set_object_tags(req.bucket, req.key_checked(), {})
    return empty(204)


async def get_bucket_tagging(req: S3Request) -> web.Response:
    info = await req.owned_bucket()
    if not info.tags:
        raise S3Error(ErrorCode.NoSuchTagSet, extra={"BucketName": req.bucket})
    return xml_response("Tagging", tagging_nodes(info.tags))


async def put_bucket_tagging(req: S3Request) -> web.Response:
    await req.owned_bucket()
    await req.store.set_bucket_tags(req.bucket, parse_tagging(await req.body_bytes(xml.MAX_REQUEST_XML), MAX_BUCKET_TAGS))
    return empty(204)


async def delete_bucket_tagging(req: S3Request) -> web.Response:
    await req.owned_bucket()
    await req.store.set_bucket_tags(req.bucket, {})
    return empty(204)
