"""Listing operations: ListObjects (v1), ListObjectsV2, ListObjectVersions (unversioned buckets)."""

from __future__ import annotations

from urllib.parse import quote

from aiohttp import web

from protocol.errors import ErrorCode, S3Error
from storage_server.store import ListPage, ObjectMeta

from .. import xml
from ..context import S3Request
from .common import decode_token, encode_token, xml_response


def _encoder(req: S3Request):
    enc = req.query.get("encoding-type")
    if enc is None:
        return None, lambda s: s
    if enc != "url":
        raise S3Error(ErrorCode.InvalidArgument, "Invalid Encoding Method specified in Request", extra={"ArgumentName": "encoding-type", "ArgumentValue": enc})
    return "url", lambda s: None if s is None else quote(s, safe="/")


async def _page(req: S3Request, after: str) -> tuple[ListPage, int, str, str]:
    await req.owned_bucket()
    limit = req.int_param("max-keys", req.config.max_list_keys, lo=0, hi=req.config.max_list_keys)
    prefix, delimiter = req.query.get("prefix", ""), req.query.get("delimiter", "")
    if "encoding-type" not in req.query:  # echoed raw: they must be text XML can carry
        for name, value in (("prefix", prefix), ("delimiter", delimiter), ("marker", after)):
            xml.check_text(name, value)
    if limit == 0:  # S3 answers max-keys=0 with an empty page that is not truncated, whatever the bucket holds
        return ListPage([], [], False, None), limit, prefix, delimiter
    page = await req.store.list_objects(req.bucket, prefix, delimiter, after, limit)
    return page, limit, prefix, delimiter


def _owner(o: ObjectMeta) -> list[xml.Node]:
    return [("ID", o.owner), ("DisplayName", o.owner)]


def _contents(objects: list[ObjectMeta], enc, with_owner: bool) -> list[xml.Node]:
    return [
        ("Contents", [("Key", enc(o.key)), ("LastModified", xml.iso8601(o.last_modified)), ("ETag", o.etag), ("Size", o.size),
                      ("Owner", _owner(o) if with_owner else None), ("StorageClass", o.storage_class),
                      *[("ChecksumAlgorithm", a) for a in o.checksums]])
        for o in objects
    ]


def _prefixes(page: ListPage, enc) -> list[xml.Node]:
    return [("CommonPrefixes", [("Prefix", enc(p))]) for p in page.common_prefixes]


def _v1_prefix(prefix: str, enc) -> str:
    """ListObjects (v1) echoes its Prefix as sent even with ``encoding-type=url``, as S3 does (botocore,
    which asks for url encoding on every v1 listing, decodes Delimiter, Marker and keys but not Prefix:
    a prefix holding a newline would come back as ``%0A``). Only text XML cannot carry is encoded."""
    try:
        return xml.check_text("prefix", prefix)
    except S3Error:
        return enc(prefix)


async def list_objects_v1(req: S3Request) -> web.Response:
    encoding, enc = _encoder(req)
    marker = req.query.get("marker", "")
    page, limit, prefix, delimiter = await _page(req, marker)
    return xml_response(
        "ListBucketResult",
        [
            ("Name", req.bucket), ("Prefix", _v1_prefix(prefix, enc)), ("Marker", enc(marker)), ("MaxKeys", limit),
            ("Delimiter", enc(delimiter) if delimiter else None), ("IsTruncated", page.is_truncated),
            ("NextMarker", enc(page.next_marker) if page.is_truncated and delimiter else None),
            ("EncodingType", encoding),
            *_contents(page.objects, enc, True), *_prefixes(page, enc),
        ],
    )


async def list_objects_v2(req: S3Request) -> web.Response:
    encoding, enc = _encoder(req)
    token = req.query.get("continuation-token")
    start_after = req.query.get("start-after", "")
    after = decode_token(token) if token is not None else start_after
    page, limit, prefix, delimiter = await _page(req, after)
    fetch_owner = req.query.get("fetch-owner", "false").lower() == "true"
    return xml_response(
        "ListBucketResult",
        [
            ("Name", req.bucket), ("Prefix", enc(prefix)), ("MaxKeys", limit), ("KeyCount", len(page.objects) + len(page.common_prefixes)),
            ("Delimiter", enc(delimiter) if delimiter else None), ("IsTruncated", page.is_truncated),
            ("ContinuationToken", token), ("NextContinuationToken", encode_token(page.next_marker) if page.is_truncated and page.next_marker else None),
            ("StartAfter", enc(start_after) if start_after else None), ("EncodingType", encoding),
            *_contents(page.objects, enc, fetch_owner), *_prefixes(page, enc),
        ],
    )


async def list_object_versions(req: S3Request) -> web.Response:
    """Unversioned buckets: every object is its single, latest version ``null``."""
    encoding, enc = _encoder(req)
    key_marker = req.query.get("key-marker", "")
    page, limit, prefix, delimiter = await _page(req, key_marker)
    versions = [
        ("Version", [("Key", enc(o.key)), ("VersionId", "null"), ("IsLatest", True), ("LastModified", xml.iso8601(o.last_modified)),
                     ("ETag", o.etag), ("Size", o.size), ("StorageClass", o.storage_class), ("Owner", _owner(o))])
        for o in page.objects
    ]
    return xml_response(
        "ListVersionsResult",
        [
            ("Name", req.bucket), ("Prefix", enc(prefix)), ("KeyMarker", enc(key_marker)), ("VersionIdMarker", req.query.get("version-id-marker", "")),
            ("MaxKeys", limit), ("Delimiter", enc(delimiter) if delimiter else None), ("IsTruncated", page.is_truncated),
            ("NextKeyMarker", enc(page.next_marker) if page.is_truncated else None),
            ("NextVersionIdMarker", "null" if page.is_truncated else None), ("EncodingType", encoding),
            *versions, *_prefixes(page, enc),
        ],
    )
