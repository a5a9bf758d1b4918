"""Multipart upload operations: Create, UploadPart, UploadPartCopy, Complete, Abort, ListParts, ListMultipartUploads."""

from __future__ import annotations

from dataclasses import replace

from aiohttp import web

from protocol.checksums import ALGORITHMS, composite_checksum, full_object_checksum
from protocol.errors import ErrorCode, S3Error
from storage_server.store import ByteRange, ObjectMeta, UploadInfo

from .. import headers as h
from .. import xml
from ..context import S3Request
from .common import empty, part_number, xml_response
from .objects import checksum_response_headers, copy_source_meta


def _owner(tenant: str) -> list[xml.Node]:
    return [("ID", tenant), ("DisplayName", tenant)]


async def _upload(req: S3Request) -> UploadInfo:
    await req.owned_bucket()
    return await req.store.get_upload(req.bucket, req.key_checked(), req.query["uploadId"])


async def create_multipart_upload(req: S3Request) -> web.Response:
    await req.owned_bucket()
    key = req.key_checked()
    spec, _ = h.put_spec(req.headers, None)
    alg = req.headers.get("x-amz-checksum-algorithm")
    ctype = _checksum_type(req, alg)
    upload = await req.store.create_upload(req.bucket, key, replace(spec, checksum_type=ctype), req.tenant)
    headers = {"x-amz-checksum-algorithm": alg.upper(), "x-amz-checksum-type": ctype} if alg else None
    return xml_response("InitiateMultipartUploadResult", [("Bucket", req.bucket), ("Key", key), ("UploadId", upload.upload_id)], headers=headers)


async def upload_part(req: S3Request) -> web.Response:
    number = part_number(req.query.get("partNumber", ""))
    upload = await _upload(req)
    spec, trailer = h.put_spec(req.headers, req.expected_length())
    if trailer:
        spec = replace(spec, late_checksums=lambda: h.trailer_checksums(trailer, req.trailers))
    part = await req.store.upload_part(upload, number, req.body(), spec)
    algs = tuple(set(spec.checksum_algorithms) | set(upload.spec.checksum_algorithms))
    return empty(headers={"ETag": part.etag, **checksum_response_headers(part.checksums, algs)})


async def upload_part_copy(req: S3Request) -> web.Response:
    number = part_number(req.query.get("partNumber", ""))
    upload = await _upload(req)
    src = await copy_source_meta(req)
    rng = None
    raw = req.headers.get("x-amz-copy-source-range")
    if raw is not None:
        first, _, last = raw.removeprefix("bytes=").partition("-")
        if not raw.startswith("bytes=") or not first.isdigit() or not last.isdigit() or int(first) > int(last):
            raise S3Error(ErrorCode.InvalidArgument, "The x-amz-copy-source-range value must be of the form bytes=first-last where first and last are the zero-based offsets of the first and last bytes to copy", extra={"ArgumentName": "x-amz-copy-source-range"})
        if int(last) >= src.size:
            raise S3Error(ErrorCode.InvalidRange, extra={"RangeRequested": raw, "ActualObjectSize": str(src.size)})
        rng = ByteRange(int(first), int(last) + 1)
    part = await req.store.upload_part_copy(upload, number, src, rng)
    checks: list[xml.Node] = [(f"Checksum{a}", v) for a, v in part.checksums.items()]
    return xml_response("CopyPartResult", [("ETag", part.etag), ("LastModified", xml.iso8601(part.last_modified)), *checks])


async def complete_multipart_upload(req: S3Request) -> web.Response:
    condition = h.write_condition(req.headers)
    try:
        upload = await _upload(req)
    except S3Error as e:
        # A retry of a Complete whose response was lost (aws-cli and boto3 retry) gets the same answer.
        done = await req.store.completed_upload(req.bucket, req.key, req.query["uploadId"]) if e.code == ErrorCode.NoSuchUpload else None
        if done is None:
            raise
        return _completed(req, done)
    claims = h.object_checksum_claims(req.headers)
    doc = xml.parse(await req.body_bytes(xml.MAX_REQUEST_XML, object_checksums=True), "CompleteMultipartUpload")
    parts = []
    for p in xml.children(doc, "Part"):
        number, etag = xml.child_text(p, "PartNumber"), xml.child_text(p, "ETag")
        if number is None or not number.strip().isdigit() or etag is None:
            raise S3Error(ErrorCode.MalformedXML, "Each <Part> needs a numeric <PartNumber> and an <ETag>.")
        claimed = {a: v for a in ALGORITHMS if (v := xml.child_text(p, f"Checksum{a}"))}
        parts.append((int(number), etag.strip(), claimed))
    if claims:
        await _verify_object_checksums(req, upload, [n for n, _, _ in parts], claims)
    return _completed(req, await req.store.complete_upload(upload, parts, condition))


async def _verify_object_checksums(req: S3Request, upload: UploadInfo, numbers: list[int], claims: dict[str, str]) -> None:
    """The whole object's checksum the client sent with Complete, against the one its parts make
    (COMPOSITE: the checksum of the parts' checksums; FULL_OBJECT: the parts' CRCs combined), before
    anything is committed. Where the store does not know a part's checksum (an upstream that does not
    list them), the store's own value stands."""
    stored = {p.part_number: p for p in await req.store.list_parts(upload, 0, 10000)}
    chosen = [stored.get(n) for n in numbers]
    for alg, claimed in claims.items():
        values = [p.checksums.get(alg) if p is not None else None for p in chosen]
        if not all(values):
            continue
        if upload.spec.checksum_type == "COMPOSITE":
            ours = composite_checksum(alg, values)  # type: ignore[arg-type]
        else:
            ours = full_object_checksum(alg, [(v, p.size) for v, p in zip(values, chosen)])  # type: ignore[misc, union-attr]
        if ours is not None and ours != claimed:
            raise S3Error(ErrorCode.BadDigest, f"The {alg} you specified ({claimed}) did not match the checksum of the parts ({ours}).")


def _checksum_type(req: S3Request, alg: str | None) -> str:
    """COMPOSITE (a checksum of the parts' checksums, "-N") or FULL_OBJECT (of the whole object; CRC algorithms only)."""
    default = "FULL_OBJECT" if (alg or "").upper() == "CRC64NVME" else "COMPOSITE"
    ctype = req.headers.get("x-amz-checksum-type", default).upper()
    if ctype not in ("COMPOSITE", "FULL_OBJECT"):
        raise S3Error(ErrorCode.InvalidRequest, "x-amz-checksum-type must be COMPOSITE or FULL_OBJECT.")
    if ctype == "FULL_OBJECT" and (alg or "").upper() in ("SHA1", "SHA256"):
        raise S3Error(ErrorCode.InvalidRequest, f"The FULL_OBJECT checksum type is not supported for {alg.upper()}; use COMPOSITE.")
    if ctype == "COMPOSITE" and (alg or "").upper() == "CRC64NVME":
        raise S3Error(ErrorCode.InvalidRequest, "CRC64NVME supports only the FULL_OBJECT checksum type.")
    return ctype


def _completed(req: S3Request, meta: ObjectMeta) -> web.Response:
    checks: list[xml.Node] = [(f"Checksum{a}", v) for a, v in meta.checksums.items()]
    if meta.checksums:
        checks.append(("ChecksumType", "COMPOSITE" if any("-" in v for v in meta.checksums.values()) else "FULL_OBJECT"))
    return xml_response(
        "CompleteMultipartUploadResult",
        [("Location", f"http://{req.headers.get('Host', '')}{req.resource}"), ("Bucket", req.bucket), ("Key", req.key), ("ETag", meta.etag), *checks],
    )


async def abort_multipart_upload(req: S3Request) -> web.Response:
    await req.store.abort_upload(await _upload(req))
    return empty(204)


async def list_parts(req: S3Request) -> web.Response:
    upload = await _upload(req)
    limit = req.int_param("max-parts", 1000, lo=0, hi=1000)
    after = req.int_param("part-number-marker", 0, lo=0)
    parts = await req.store.list_parts(upload, after, limit + 1)
    truncated = len(parts) > limit
    parts = parts[:limit]
    algorithm = upload.spec.checksum_algorithms[0] if upload.spec.checksum_algorithms else None
    return xml_response(
        "ListPartsResult",
        [
            ("Bucket", req.bucket),
            ("Key", req.key),
            ("UploadId", upload.upload_id),
            ("PartNumberMarker", after),
            ("NextPartNumberMarker", parts[-1].part_number if parts else None),
            ("MaxParts", limit),
            ("IsTruncated", truncated),
            ("ChecksumAlgorithm", algorithm),
            *[
                ("Part", [("PartNumber", p.part_number), ("LastModified", xml.iso8601(p.last_modified)), ("ETag", p.etag), ("Size", p.size),
                          *[(f"Checksum{a}", v) for a, v in p.checksums.items()]])
                for p in parts
            ],
            ("Initiator", _owner(upload.owner)),
            ("Owner", _owner(upload.owner)),
            ("StorageClass", "STANDARD"),
        ],
    )


async def list_multipart_uploads(req: S3Request) -> web.Response:
    await req.owned_bucket()
    limit = req.int_param("max-uploads", 1000, lo=0, hi=1000)
    prefix = req.query.get("prefix", "")
    delimiter = req.query.get("delimiter", "")
    key_marker = req.query.get("key-marker", "")
    upload_marker = req.query.get("upload-id-marker", "") if key_marker else ""
    if not key_marker:
        # An upload-id marker without a key marker is ignored, as S3 does.
        upload_marker = ""
    page = await req.store.list_uploads_page(req.bucket, prefix, delimiter, key_marker, upload_marker, limit)
    uploads: list[xml.Node] = [
        ("Upload", [("Key", u.key), ("UploadId", u.upload_id), ("Initiator", _owner(u.owner)), ("Owner", _owner(u.owner)),
                    ("StorageClass", "STANDARD"), ("Initiated", xml.iso8601(u.initiated))])
        for u in page.uploads
    ]
    return xml_response(
        "ListMultipartUploadsResult",
        [
            ("Bucket", req.bucket),
            ("KeyMarker", key_marker),
            ("UploadIdMarker", upload_marker),
            ("NextKeyMarker", page.next_key_marker),
            ("NextUploadIdMarker", page.next_upload_id_marker),
            ("Prefix", prefix),
            ("Delimiter", delimiter or None),
            ("MaxUploads", limit),
            ("IsTruncated", page.is_truncated),
            *uploads,
            *[("CommonPrefixes", [("Prefix", p)]) for p in page.common_prefixes],
        ],
    )
