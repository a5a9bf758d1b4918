"""Object operations: PutObject, GetObject, HeadObject, DeleteObject, DeleteObjects, CopyObject."""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import unquote

from aiohttp import web

from protocol.errors import ErrorCode, S3Error
from protocol.rdma_token import HEADER_RDMA_TOKEN
from storage_server.store import ByteRange, ObjectMeta, PutSpec

from .. import headers as h
from .. import xml
from ..access import canned_acl
from ..context import MAX_KEY_BYTES, S3Request
from ..meta_encoding import MetadataResponse, MetadataStreamResponse
from .common import empty, part_number, xml_response
from .rdma_get import rdma_get_object

MAX_DELETE_KEYS = 1000
GET_PREFETCH = 64 * 1024  # objects up to this size are answered from the metadata call's read


def checksum_response_headers(checksums: dict[str, str], algorithms: tuple[str, ...]) -> dict[str, str]:
    return {f"x-amz-checksum-{a.lower()}": checksums[a] for a in algorithms if a in checksums}


async def put_object(req: S3Request) -> web.Response:
    await req.owned_bucket()
    key = req.key_checked()
    spec, trailer = h.put_spec(req.headers, req.expected_length())
    condition = h.write_condition(req.headers)
    if trailer:
        # The trailer arrives after the data; the body stream fills req.trailers
        # before it ends, and the backend verifies only after the stream ends.
        spec = replace(spec, late_checksums=lambda: h.trailer_checksums(trailer, req.trailers))
    meta = await req.store.put_object(req.bucket, key, req.body(), spec, req.tenant, condition)
    return empty(headers={"ETag": meta.etag, **checksum_response_headers(meta.checksums, spec.checksum_algorithms)})


def _part_range(meta: ObjectMeta, part_number: int) -> ByteRange:
    """The bytes of part ``part_number`` (an object uploaded whole is its one part); 400 InvalidPart past the last."""
    sizes = meta.part_sizes or (meta.size,)
    if part_number > len(sizes):
        raise S3Error(ErrorCode.InvalidPart, f"The object has {len(sizes)} part(s); part {part_number} does not exist.",
                      extra={"PartNumber": str(part_number), "PartsCount": str(len(sizes))})
    start = sum(sizes[: part_number - 1])
    return ByteRange(start, start + sizes[part_number - 1])


def _response_plan(req: S3Request, meta: ObjectMeta) -> tuple[ByteRange | None, int, dict[str, str]]:
    """Shared by GET and HEAD: conditions, range/partNumber, headers."""
    h.check_conditions(req.headers, meta)
    headers = h.object_headers(meta, req.headers.get("x-amz-checksum-mode", "").upper() == "ENABLED")
    part = req.query.get("partNumber")
    if part is not None:
        part_rng = _part_range(meta, part_number(part))
        # Part 1 of an object uploaded whole is all of it: a plain 200, not a 206.
        rng = None if not meta.part_sizes and meta.size == part_rng.length else part_rng
        headers["x-amz-mp-parts-count"] = str(len(meta.part_sizes) or 1)
    else:
        rng = h.parse_range(req.headers.get("Range"), meta.size)
    status = 200
    if rng is not None:
        status = 206
        for k in [k for k in headers if k.startswith("x-amz-checksum-")]:
            del headers[k]  # a byte range has no whole-object checksum
        headers["Content-Range"] = f"bytes {rng.start}-{rng.end - 1}/{meta.size}"
    for param, header in h.RESPONSE_OVERRIDES.items():
        if param in req.query:
            headers[header] = req.query[param]
    return rng, status, headers


async def get_object(req: S3Request) -> web.StreamResponse:
    if HEADER_RDMA_TOKEN in req.headers:  # S3 over RDMA: the bytes go into the client's registered memory
        return await rdma_get_object(req, lambda meta: _response_plan(req, meta))
    bucket = await req.readable_bucket()
    # Metadata, the open file and a small object's bytes come in one backend call, all of one version.
    reader = await req.readable(req.store.open_object(req.bucket, req.key_checked(), prefetch=GET_PREFETCH), bucket)
    try:
        req.check_read(reader.meta, bucket)
        rng, status, headers = _response_plan(req, reader.meta)
        start, end = (rng.start, rng.end) if rng else (0, reader.meta.size)
        if end <= len(reader.head):
            return MetadataResponse(status=status, headers=headers, body=reader.head[start:end])
        resp = MetadataStreamResponse(status=status, headers=headers)
        resp.content_length = end - start
        await resp.prepare(req.http)
        async for chunk in reader.stream(rng):
            await resp.write(chunk)
        await resp.write_eof()
        return resp
    finally:
        reader.close()


async def head_object(req: S3Request) -> web.StreamResponse:
    bucket = await req.readable_bucket()
    meta = await req.readable(req.store.head_object(req.bucket, req.key_checked()), bucket)
    req.check_read(meta, bucket)
    rng, status, headers = _response_plan(req, meta)
    headers["Content-Length"] = str(rng.length if rng else meta.size)
    return MetadataResponse(status=status, headers=headers)


async def delete_object(req: S3Request) -> web.Response:
    await req.owned_bucket()
    await req.store.delete_object(req.bucket, req.key_checked())
    return empty(204)


async def delete_objects(req: S3Request) -> web.Response:
    await req.owned_bucket()
    if "Content-MD5" not in req.headers and not any(k.lower().startswith(("x-amz-checksum-", "x-amz-sdk-checksum-")) for k in req.headers):
        # S3 requires an integrity check on this request: a corrupted body could delete other keys.
        raise S3Error(ErrorCode.InvalidRequest, "Missing required header for this request: Content-MD5 (or an x-amz-checksum-* header).")
    doc = xml.parse(await req.body_bytes(xml.MAX_REQUEST_XML), "Delete")
    quiet = (xml.child_text(doc, "Quiet", "false") or "").strip().lower() == "true"
    objects = xml.children(doc, "Object")
    if len(objects) > MAX_DELETE_KEYS:
        raise S3Error(ErrorCode.MalformedXML, f"A DeleteObjects request may name at most {MAX_DELETE_KEYS} keys; got {len(objects)}.")
    results: list[xml.Node] = []
    deletable: list[str] = []
    for obj in objects:
        key = xml.child_text(obj, "Key")
        if key is None:
            raise S3Error(ErrorCode.MalformedXML, "Every <Object> needs a <Key>.")
        if len(key.encode()) > MAX_KEY_BYTES:
            results.append(("Error", [("Key", key), ("Code", ErrorCode.KeyTooLongError.name), ("Message", ErrorCode.KeyTooLongError.default_message)]))
            continue
        version = xml.child_text(obj, "VersionId")
        if version not in (None, "null"):
            results.append(("Error", [("Key", key), ("VersionId", version), ("Code", ErrorCode.NoSuchVersion.name),
                                      ("Message", ErrorCode.NoSuchVersion.default_message)]))
            continue
        deletable.append(key)
    await req.store.delete_many(req.bucket, deletable)
    if not quiet:
        results += [("Deleted", [("Key", key)]) for key in deletable]
    return xml_response("DeleteResult", results)


def parse_copy_source(value: str) -> tuple[str, str]:
    src, _, qs = value.partition("?")
    src = unquote(src).lstrip("/")
    bucket, _, key = src.partition("/")
    if not bucket or not key:
        raise S3Error(ErrorCode.InvalidArgument, "Copy Source must mention the source bucket and key: sourcebucket/sourcekey", extra={"ArgumentName": "x-amz-copy-source"})
    if qs:
        params = dict(p.partition("=")[::2] for p in qs.split("&"))
        if params.get("versionId", "null") != "null":
            raise S3Error(ErrorCode.NoSuchVersion, extra={"Key": key, "VersionId": params["versionId"]})
    return bucket, key


async def copy_source_meta(req: S3Request) -> ObjectMeta:
    bucket, key = parse_copy_source(req.headers["x-amz-copy-source"])
    await req.owned_bucket(bucket)
    meta = await req.store.head_object(bucket, key)
    h.check_conditions(req.headers, meta, prefix="x-amz-copy-source-", copy_source=True)
    return meta


async def copy_object(req: S3Request) -> web.Response:
    await req.owned_bucket()
    key = req.key_checked()
    condition = h.write_condition(req.headers)  # of the destination; the source's are x-amz-copy-source-if-*
    src = await copy_source_meta(req)
    directive = req.headers.get("x-amz-metadata-directive", "COPY").upper()
    if directive not in ("COPY", "REPLACE"):
        raise S3Error(ErrorCode.InvalidArgument, "Unknown metadata directive.", extra={"ArgumentName": "x-amz-metadata-directive"})
    if directive == "COPY":
        if (src.bucket, src.key) == (req.bucket, key):
            raise S3Error(
                ErrorCode.InvalidRequest,
                "This copy request is illegal because it is trying to copy an object to itself without changing the "
                "object's metadata, storage class, website redirect location or encryption attributes.",
                resource=req.resource,
            )
        spec = PutSpec(content_type=src.content_type, user_metadata=src.user_metadata, system_headers=src.system_headers,
                       tags=src.tags, acl=canned_acl(req.headers))
    else:
        spec, _ = h.put_spec(req.headers, None)
    meta = await req.store.copy_object(src, req.bucket, key, spec, req.tenant, condition)
    checks: list[xml.Node] = [(f"Checksum{a}", v) for a, v in meta.checksums.items() if not meta.part_sizes]
    return xml_response("CopyObjectResult", [("ETag", meta.etag), ("LastModified", xml.iso8601(meta.last_modified)), *checks])
