"""Canned ACL operations: Get/PutObjectAcl, Get/PutBucketAcl (see :mod:`gateway.s3api.access`)."""

from __future__ import annotations

from aiohttp import web

from .. import xml
from ..access import acl_nodes, requested_acl
from ..context import S3Request
from .common import empty, xml_response


async def get_object_acl(req: S3Request) -> web.Response:
    await req.owned_bucket()
    meta = await req.store.head_object(req.bucket, req.key_checked())
    return xml_response("AccessControlPolicy", acl_nodes(meta.owner, meta.acl))


async def put_object_acl(req: S3Request) -> web.Response:
    await req.owned_bucket()
    body = await req.body_bytes(xml.MAX_REQUEST_XML)
    owner = (await req.store.head_object(req.bucket, req.key_checked())).owner if body.strip() else req.tenant
    await req.store.set_object_acl(req.bucket, req.key_checked(), requested_acl(req.headers, body, owner))
    return empty()


async def get_bucket_acl(req: S3Request) -> web.Response:
    info = await req.owned_bucket()  # the caller owns it: shown by tenant name, as clients name it (the record holds its owner id)
    return xml_response("AccessControlPolicy", acl_nodes(req.tenant, info.acl))


async def put_bucket_acl(req: S3Request) -> web.Response:
    await req.owned_bucket()
    await req.store.set_bucket_acl(req.bucket, requested_acl(req.headers, await req.body_bytes(xml.MAX_REQUEST_XML), req.tenant))
    return empty()
