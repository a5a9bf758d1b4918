"""Request addressing (path-style and virtual-hosted-style) and the S3 route table.

Like versitygw's ``s3api/router.go``, every operation the gateway serves is one
:class:`Route` row naming its S3 operation; :class:`Router` matches a request's
method, address level, query and header names to the first row that fits.
Extension tables (the KV operations in :mod:`gateway.kv.routes`) are combined
with this one by the :class:`Router`, not written into it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import chain
from urllib.parse import unquote

from aiohttp import web

from protocol.errors import ErrorCode, S3Error

from .context import Address, Level, S3Request
from .handlers import acl, buckets, lifecycle, listing, multipart, objects, tagging

Handler = Callable[[S3Request], Awaitable[web.StreamResponse]]


def address(raw_path: str, host: str, domains: tuple[str, ...]) -> Address:
    """Split the request target into bucket and key.

    ``bucket.<domain>`` hosts select virtual-hosted style, where the whole
    path is the key; otherwise the first path segment is the bucket.
    """
    try:
        path = unquote(raw_path, errors="strict")  # invalid UTF-8 must not turn two keys into one
    except UnicodeDecodeError:
        raise S3Error(ErrorCode.InvalidURI, "The request path is not valid UTF-8 once percent-decoded.") from None
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


@dataclass(frozen=True)
class Route:
    """One operation: the request shape that selects it and the coroutine that serves it.

    ``query`` lists sub-resources that must be present (``"uploads"``) or equal
    a value (``"list-type=2"``); ``header`` names a header that must be present.
    Rows without a condition are the fallback for their method and level, so a
    table lists its more specific rows first.
    """

    method: str
    level: Level
    operation: str
    handler: Handler
    query: tuple[str, ...] = ()
    header: str | None = None
    _conditions: tuple[tuple[str, str | None], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parsed = tuple((name, value if eq else None) for name, eq, value in (c.partition("=") for c in self.query))
        object.__setattr__(self, "_conditions", parsed)

    def matches(self, query: Mapping[str, str], headers: Container[str]) -> bool:
        if self.header is not None and self.header not in headers:
            return False
        return all(name in query if value is None else query.get(name) == value for name, value in self._conditions)


# Sub-resources S3 defines that this gateway does not implement (answered 501, not misrouted). One that a
# row names (``versioning``: GetBucketVersioning) is served by that row only, and 501 everywhere else.
UNSUPPORTED_SUBRESOURCES = frozenset(
    "accelerate analytics cors encryption intelligent-tiering inventory legal-hold lifecycle logging metrics "
    "notification object-lock ownershipControls policy policyStatus publicAccessBlock replication requestPayment "
    "restore retention select torrent versioning website attributes".split()
)

COPY_SOURCE = "x-amz-copy-source"

ROUTES: tuple[Route, ...] = (
    Route("GET", Level.SERVICE, "ListBuckets", buckets.list_buckets),
    Route("GET", Level.BUCKET, "GetBucketTagging", tagging.get_bucket_tagging, query=("tagging",)),
    Route("PUT", Level.BUCKET, "PutBucketTagging", tagging.put_bucket_tagging, query=("tagging",)),
    Route("DELETE", Level.BUCKET, "DeleteBucketTagging", tagging.delete_bucket_tagging, query=("tagging",)),
    Route("GET", Level.OBJECT, "GetObjectTagging", tagging.get_object_tagging, query=("tagging",)),
    Route("PUT", Level.OBJECT, "PutObjectTagging", tagging.put_object_tagging, query=("tagging",)),
    Route("DELETE", Level.OBJECT, "DeleteObjectTagging", tagging.delete_object_tagging, query=("tagging",)),
    Route("GET", Level.BUCKET, "GetBucketAcl", acl.get_bucket_acl, query=("acl",)),
    Route("PUT", Level.BUCKET, "PutBucketAcl", acl.put_bucket_acl, query=("acl",)),
    Route("GET", Level.OBJECT, "GetObjectAcl", acl.get_object_acl, query=("acl",)),
    Route("PUT", Level.OBJECT, "PutObjectAcl", acl.put_object_acl, query=("acl",)),
    Route("GET", Level.BUCKET, "GetBucketLifecycleConfiguration", lifecycle.get_bucket_lifecycle, query=("lifecycle",)),
    Route("PUT", Level.BUCKET, "PutBucketLifecycleConfiguration", lifecycle.put_bucket_lifecycle, query=("lifecycle",)),
    Route("DELETE", Level.BUCKET, "DeleteBucketLifecycle", lifecycle.delete_bucket_lifecycle, query=("lifecycle",)),
    Route("GET", Level.BUCKET, "GetBucketLocation", buckets.get_bucket_location, query=("location",)),
    Route("GET", Level.BUCKET, "GetBucketVersioning", buckets.get_bucket_versioning, query=("versioning",)),
    Route("PUT", Level.BUCKET, "PutBucketVersioning", buckets.put_bucket_versioning, query=("versioning",)),
    Route("GET", Level.BUCKET, "GetBucketPolicy", buckets.get_bucket_policy, query=("policy",)),
    Route("GET", Level.BUCKET, "GetBucketNotificationConfiguration", buckets.get_bucket_notification, query=("notification",)),
    Route("GET", Level.BUCKET, "ListMultipartUploads", multipart.list_multipart_uploads, query=("uploads",)),
    Route("GET", Level.BUCKET, "ListObjectVersions", listing.list_object_versions, query=("versions",)),
    Route("GET", Level.BUCKET, "ListObjectsV2", listing.list_objects_v2, query=("list-type=2",)),
    Route("GET", Level.BUCKET, "ListObjects", listing.list_objects_v1),
    Route("PUT", Level.BUCKET, "CreateBucket", buckets.create_bucket),
    Route("HEAD", Level.BUCKET, "HeadBucket", buckets.head_bucket),
    Route("DELETE", Level.BUCKET, "DeleteBucket", buckets.delete_bucket),
    Route("POST", Level.BUCKET, "DeleteObjects", objects.delete_objects, query=("delete",)),
    Route("PUT", Level.OBJECT, "UploadPartCopy", multipart.upload_part_copy, query=("uploadId",), header=COPY_SOURCE),
    Route("PUT", Level.OBJECT, "UploadPart", multipart.upload_part, query=("uploadId",)),
    Route("PUT", Level.OBJECT, "CopyObject", objects.copy_object, header=COPY_SOURCE),
    Route("PUT", Level.OBJECT, "PutObject", objects.put_object),
    Route("GET", Level.OBJECT, "ListParts", multipart.list_parts, query=("uploadId",)),
    Route("GET", Level.OBJECT, "GetObject", objects.get_object),
    Route("HEAD", Level.OBJECT, "HeadObject", objects.head_object),
    Route("DELETE", Level.OBJECT, "AbortMultipartUpload", multipart.abort_multipart_upload, query=("uploadId",)),
    Route("DELETE", Level.OBJECT, "DeleteObject", objects.delete_object),
    Route("POST", Level.OBJECT, "CreateMultipartUpload", multipart.create_multipart_upload, query=("uploads",)),
    Route("POST", Level.OBJECT, "CompleteMultipartUpload", multipart.complete_multipart_upload, query=("uploadId",)),
)


class Router:
    """Route tables combined in order: a row of an earlier table wins over any row of a later one."""

    def __init__(self, *tables: Iterable[Route]) -> None:
        self.routes = tuple(chain(*tables))
        self._candidates: dict[tuple[str, Level], list[Route]] = {}
        for r in self.routes:
            self._candidates.setdefault((r.method, r.level), []).append(r)
        # Query names that select an operation: a request may carry at most one of them.
        self.selectors = frozenset(name for r in self.routes for name, _ in r._conditions)
        self._served = frozenset((r.method, r.level, name) for r in self.routes for name, _ in r._conditions)

    def match(self, method: str, level: Level, query: Mapping[str, str], headers: Container[str]) -> Route:
        """The route for a request; a pure function of its arguments (``headers`` needs only ``in``)."""
        for sub in query:
            if sub in UNSUPPORTED_SUBRESOURCES and (method, level, sub) not in self._served:
                raise S3Error(ErrorCode.NotImplemented, f"The {sub!r} sub-resource is not implemented by ObjectCache.")
        chosen = sorted(self.selectors.intersection(query))
        if len(chosen) > 1:
            # Never let one sub-resource ride on a request authorised for another (e.g. ?delete&kv-get).
            raise S3Error(ErrorCode.InvalidRequest, f"The request names more than one operation: {', '.join(chosen)}.")
        for route in self._candidates.get((method, level), ()):
            if route.matches(query, headers):
                return route
        raise S3Error(ErrorCode.MethodNotAllowed)
