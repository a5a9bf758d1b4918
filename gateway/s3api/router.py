"""Request addressing (path-style and virtual-hosted-style) and the operation table."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import unquote

from aiohttp import web

from protocol.errors import ErrorCode, S3Error

from .context import S3Request
from .handlers import buckets, listing, multipart, objects

Handler = Callable[[S3Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Address:
    bucket: str | None
    key: str | None
    path_style: bool = True


def address(raw_path: str, host: str, domains: tuple[str, ...]) -> Address:
    """Split the request target into bucket and key.

    ``bucket.<domain>`` hosts select virtual-hosted style, where the whole
    path is the key; otherwise the first path segment is the bucket.
    """
    path = unquote(raw_path)
    hostname = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    for domain in domains:
        if hostname.endswith("." + domain):
            bucket = hostname[: -len(domain) - 1]
            key = path[1:] if path.startswith("/") else path
            return Address(bucket, key or None, path_style=False)
    rest = path[1:] if path.startswith("/") else path
    if not rest:
        return Address(None, None)
    bucket, sep, key = rest.partition("/")
    return Address(bucket, key if sep and key else None)


# Sub-resources S3 defines that this gateway does not implement (answered 501, not misrouted).
UNSUPPORTED_SUBRESOURCES = frozenset(
    "accelerate acl analytics cors encryption intelligent-tiering inventory legal-hold lifecycle logging metrics "
    "notification object-lock ownershipControls policy policyStatus publicAccessBlock replication requestPayment "
    "restore retention select tagging torrent versioning website attributes".split()
)

# Extension operations (KV) register here: (method, level, sub-resource) -> handler.
EXTENSIONS: dict[tuple[str, str, str], Handler] = {}


def route(method: str, addr: Address, query: dict[str, str]) -> Handler:
    for sub in query:
        if sub in UNSUPPORTED_SUBRESOURCES:
            raise S3Error(ErrorCode.NotImplemented, f"The {sub!r} sub-resource is not implemented by ObjectCache.")
    level = "service" if addr.bucket is None else "bucket" if addr.key is None else "object"
    for (m, lvl, sub), handler in EXTENSIONS.items():
        if m == method and lvl == level and sub in query:
            return handler
    if addr.bucket is None:
        if method == "GET":
            return buckets.list_buckets
        raise S3Error(ErrorCode.MethodNotAllowed)
    if addr.key is None:
        table: dict[str, Handler] | None = {
            "GET": _bucket_get(query),
            "PUT": buckets.create_bucket,
            "HEAD": buckets.head_bucket,
            "DELETE": buckets.delete_bucket,
            "POST": objects.delete_objects if "delete" in query else None,
        }.get(method)  # type: ignore[assignment]
        if table is None:
            raise S3Error(ErrorCode.MethodNotAllowed)
        return table  # type: ignore[return-value]
    copy = "x-amz-copy-source"
    if method == "PUT":
        if "uploadId" in query:
            return _with_header(copy, multipart.upload_part_copy, multipart.upload_part)
        return _with_header(copy, objects.copy_object, objects.put_object)
    if method == "GET":
        return multipart.list_parts if "uploadId" in query else objects.get_object
    if method == "HEAD":
        return objects.head_object
    if method == "DELETE":
        return multipart.abort_multipart_upload if "uploadId" in query else objects.delete_object
    if method == "POST":
        if "uploads" in query:
            return multipart.create_multipart_upload
        if "uploadId" in query:
            return multipart.complete_multipart_upload
    raise S3Error(ErrorCode.MethodNotAllowed)


def _bucket_get(query: dict[str, str]) -> Handler:
    if "location" in query:
        return buckets.get_bucket_location
    if "uploads" in query:
        return multipart.list_multipart_uploads
    if "versions" in query:
        return listing.list_object_versions
    if query.get("list-type") == "2":
        return listing.list_objects_v2
    return listing.list_objects_v1


def _with_header(name: str, if_present: Handler, otherwise: Handler) -> Handler:
    async def dispatch(req: S3Request) -> web.StreamResponse:
        return await (if_present if name in req.headers else otherwise)(req)

    return dispatch
