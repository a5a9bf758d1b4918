"""Canned ACL operations: Get/PutObjectAcl, Get/PutBucketAcl (see :mod:`gateway.s3api.access`)."""

from __future__ import annotations

from aiohttp import web

from .. import xml
from ..access import acl_nodes, canned_acl, reject_grant_lists
from ..context import S3Request
from .common import empty, xml_response


async def get_object_acl(req: S3Request) -> web.Response:
    await req.owned_bucket()
    meta = await req.store.head_object(req.bucket, req.key_checked())
    return xml_response("AccessControlPolicy", acl_nodes(meta.owner, meta.acl))


async def put_object_acl(req: S3Request) -> web.Response:
    await req.owned_bucket()
    reject_grant_lists(req.headers, await req.body_bytes(xml.MAX_REQUEST_XML))
    await req.store.set_object_acl(req.bucket, req.key_checked(), canned_acl(req.headers))
    return empty()


async def get_bucket_acl(req: S3Request) -> web.Response:
    info = await req.owned_bucket()
    return xml_response("AccessControlPolicy", acl_nodes(info.owner, info.acl))


async def put_bucket_acl(req: S3Request) -> web.Response:
    await req.owned_bucket()
    reject_grant_lists(req.headers, await req.body_bytes(xml.MAX_REQUEST_XML))
    await req.store.set_bucket_acl(req.bucket, canned_acl(req.headers))
    return empty()
