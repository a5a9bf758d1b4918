"""Bucket operations: ListBuckets, CreateBucket, HeadBucket, DeleteBucket, GetBucketLocation,
GetBucketVersioning and PutBucketVersioning (buckets are never versioned), and what S3 answers
for a bucket without a policy or notifications (GetBucketPolicy, GetBucketNotificationConfiguration)."""

from __future__ import annotations

from aiohttp import web

from protocol.errors import ErrorCode, S3Error

from .. import xml
from ..access import canned_acl
from ..context import S3Request, validate_bucket_name
from .common import decode_token, empty, encode_token, xml_response

MAX_BUCKETS = 10000
LEGACY_REGION = "us-east-1"  # S3's first region: its buckets report an empty LocationConstraint, and re-creating one is not an error


def _owner(req: S3Request) -> list[xml.Node]:
    return [("ID", req.tenant), ("DisplayName", req.tenant)]


async def list_buckets(req: S3Request) -> web.Response:
    limit = req.int_param("max-buckets", MAX_BUCKETS, lo=1, hi=MAX_BUCKETS)
    prefix = req.query.get("prefix", "")
    token = req.query.get("continuation-token")
    after = decode_token(token) if token else ""
    buckets = await req.store.list_buckets(req.owner_id, prefix, after, limit + 1)
    if "~" not in req.tenant and req.tenant != req.owner_id:  # and those recorded before owner ids, under the tenant's name
        legacy = await req.store.list_buckets(req.tenant, prefix, after, limit + 1)
        buckets = sorted(buckets + legacy, key=lambda b: b.name)[:limit + 1]
    truncated = len(buckets) > limit
    buckets = buckets[:limit]
    return xml_response(
        "ListAllMyBucketsResult",
        [
            ("Owner", _owner(req)),
            ("Buckets", [("Bucket", [("Name", b.name), ("CreationDate", xml.iso8601(b.created)), ("BucketRegion", b.region)]) for b in buckets]),
            ("ContinuationToken", encode_token(buckets[-1].name) if truncated else None),
            ("Prefix", prefix or None),
        ],
    )


async def _recorded_under_callers_name(req: S3Request) -> bool:
    """Whether the existing bucket's record (one written before owner ids) names the caller."""
    try:
        return req.owns(await req.store.get_bucket(req.bucket))
    except S3Error:
        return False


async def create_bucket(req: S3Request) -> web.Response:
    validate_bucket_name(req.bucket)
    region = req.config.region
    body = await req.body_bytes(64 * 1024)
    if body.strip():
        doc = xml.parse(body, "CreateBucketConfiguration")
        constraint = xml.child_text(doc, "LocationConstraint")
        if constraint and constraint != req.config.region and constraint not in req.config.region_aliases:
            raise S3Error(
                ErrorCode.InvalidLocationConstraint,
                f"The specified location-constraint {constraint!r} is not valid; this endpoint serves {req.config.region!r}"
                + (f" (also accepted: {', '.join(req.config.region_aliases)})." if req.config.region_aliases else "."),
                resource=req.resource,
            )
    try:
        await req.store.create_bucket(req.bucket, req.owner_id, region, canned_acl(req.headers))
    except S3Error as e:
        if e.code is ErrorCode.BucketAlreadyExists and await _recorded_under_callers_name(req):
            e = S3Error(ErrorCode.BucketAlreadyOwnedByYou, resource=e.resource, extra=e.extra)
        # S3's legacy us-east-1 behaviour: re-creating a bucket you own there succeeds (and changes nothing).
        if e.code is not ErrorCode.BucketAlreadyOwnedByYou or region != LEGACY_REGION:
            raise e from None
    return empty(headers={"Location": f"/{req.bucket}"})


async def head_bucket(req: S3Request) -> web.Response:
    info = await req.owned_bucket()
    return empty(headers={"x-amz-bucket-region": info.region})


async def delete_bucket(req: S3Request) -> web.Response:
    await req.owned_bucket()
    await req.store.delete_bucket(req.bucket)
    return empty(204)


async def get_bucket_location(req: S3Request) -> web.Response:
    info = await req.owned_bucket()
    return web.Response(body=xml.text_document("LocationConstraint", "" if info.region == LEGACY_REGION else info.region),
                        content_type="application/xml")


async def get_bucket_versioning(req: S3Request) -> web.Response:
    """An empty configuration: the bucket has never been versioned (what S3 answers for such a bucket;
    s3fs and rclone ask before deleting a bucket's objects)."""
    await req.owned_bucket()
    return xml_response("VersioningConfiguration", [])


async def put_bucket_versioning(req: S3Request) -> web.Response:
    await req.owned_bucket()
    raise S3Error(ErrorCode.NotImplemented, "Bucket versioning is not supported by ObjectCache: buckets are always unversioned.",
                  resource=req.resource)


async def get_bucket_policy(req: S3Request) -> web.Response:
    """404 NoSuchBucketPolicy: buckets never have one (access is the tenant's and the canned ACLs'). What S3 answers for a
    bucket without a policy, which clients (minio-py, s3cmd info) handle; a 501 they raise on."""
    await req.owned_bucket()
    raise S3Error(ErrorCode.NoSuchBucketPolicy, resource=req.resource, extra={"BucketName": req.bucket})


async def get_bucket_notification(req: S3Request) -> web.Response:
    """An empty configuration: buckets never send event notifications (what S3 answers for a bucket without any)."""
    await req.owned_bucket()
    return xml_response("NotificationConfiguration", [])
