"""S3 rules that hold whatever the store: conditional writes, immutable KV chunks, multipart completion, common-prefix grouping.

Pure functions of records, so every backend applies them the same way and they
are tested without a store.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from protocol.checksums import Digester, composite_checksum, verify_digests
from protocol.errors import ErrorCode, S3Error

from .object_store import ObjectMeta, PartInfo, PutSpec, UploadInfo, WriteCondition

MIN_PART_SIZE = 5 * 1024**2
MAX_PUT_SIZE = 5 * 1024**3

T = TypeVar("T")


# -- received bodies ---------------------------------------------------------------------------

def verify_received(spec: PutSpec, d: Digester) -> None:
    """Size, Content-MD5 and checksums (trailing ones too) against what was received."""
    if spec.expected_size is not None and d.size != spec.expected_size:
        raise S3Error(ErrorCode.IncompleteBody)
    expected = dict(spec.expected_checksums)
    if spec.late_checksums is not None:
        expected.update(spec.late_checksums())
    verify_digests(d, spec.expected_md5, expected)


# -- conditional writes ------------------------------------------------------------------------

def etag_matches(wanted: str, etag: str) -> bool:
    """An If-Match value against an ETag: quotes are not significant (S3 compares the values), ``*`` matches any."""
    return wanted.strip() == "*" or wanted.strip().strip('"') == etag.strip('"')


def check_write_condition(condition: WriteCondition | None, current: ObjectMeta | None, bucket: str, key: str,
                          committing: bool = False) -> None:
    """Whether a conditional write may replace ``current`` (None: the key holds no object), as S3 answers.

    Stores check twice: when the request starts (a failure then costs no body) and again inside the
    commit, atomically with every other write of the key. ``If-None-Match: *`` on an existing object and
    ``If-Match`` on another ETag are 412. ``If-Match`` on a missing key is 404 NoSuchKey at the start; at
    the commit (it held at the start) it means the object was deleted while the write was in flight, which
    S3 answers 409 ConditionalRequestConflict so that the client re-reads and retries.
    """
    if condition is None:
        return
    resource = f"/{bucket}/{key}"
    if condition.if_none_match and current is not None:
        raise S3Error(ErrorCode.PreconditionFailed, resource=resource, extra={"Condition": "If-None-Match"})
    if condition.if_match is None:
        return
    if current is None:
        if committing:
            raise S3Error(ErrorCode.ConditionalRequestConflict, resource=resource, extra={"Key": key})
        raise S3Error(ErrorCode.NoSuchKey, resource=resource, extra={"Key": key})
    if not etag_matches(condition.if_match, current.etag):
        raise S3Error(ErrorCode.PreconditionFailed, resource=resource, extra={"Condition": "If-Match"})


# -- immutable KV chunks ---------------------------------------------------------------------

def check_immutable_reput(existing: ObjectMeta, new: ObjectMeta) -> None:
    """A KV chunk may be put again only with identical bytes (then it is a no-op); anything else is refused."""
    if (existing.etag, existing.size) != (new.etag, new.size):
        raise S3Error(
            ErrorCode.InvalidRequest,
            f"Object {new.key!r} is an immutable KV chunk and already exists with different bytes.",
            resource=f"/{new.bucket}/{new.key}", extra={"Key": new.key},
        )


# -- multipart completion ----------------------------------------------------------------------

def select_parts(upload: UploadInfo, requested: list[tuple[int, str, dict[str, str]]],
                 stored: dict[int, tuple[PartInfo, T]], attempts: Sequence[tuple[PartInfo, T]] = ()) -> list[tuple[PartInfo, T]]:
    """The stored parts a CompleteMultipartUpload names, checked as S3 checks them.

    ``requested``: (part number, ETag, checksums the client claims) in request order;
    ``stored``: part number → (part, the store's handle on its bytes); ``attempts``: other attempts
    at those part numbers still kept, one of which the request may name by its ETag.
    """
    others = {(p.part_number, p.etag.strip('"')): (p, h) for p, h in attempts}
    if not requested:
        raise S3Error(ErrorCode.MalformedXML, "You must specify at least one part.")
    chosen: list[tuple[PartInfo, T]] = []
    prev = 0
    for number, etag, claimed in requested:
        if number <= prev:
            raise S3Error(ErrorCode.InvalidPartOrder, extra={"UploadId": upload.upload_id})
        prev = number
        hit = stored.get(number)
        if hit is None or hit[0].etag.strip('"') != etag.strip('"'):
            hit = others.get((number, etag.strip('"')))
        if hit is None:
            raise S3Error(ErrorCode.InvalidPart, extra={"UploadId": upload.upload_id, "PartNumber": str(number), "ETag": etag})
        for alg, value in claimed.items():
            if hit[0].checksums.get(alg) not in (None, value):
                raise S3Error(ErrorCode.InvalidPart, f"The {alg} checksum of part {number} does not match.")
        chosen.append(hit)
    for p, _ in chosen[:-1]:
        if p.size < MIN_PART_SIZE:
            raise S3Error(ErrorCode.EntityTooSmall,
                          extra={"ProposedSize": str(p.size), "MinSizeAllowed": str(MIN_PART_SIZE), "PartNumber": str(p.part_number)})
    return chosen


def completed_meta(upload: UploadInfo, parts: list[PartInfo], now: float) -> ObjectMeta:
    """The object a completed upload becomes: S3's multipart ETag and composite checksums."""
    md5s = b"".join(bytes.fromhex(p.etag.strip('"')) for p in parts)
    checksums = {}
    for alg in upload.spec.checksum_algorithms if upload.spec.checksum_type == "COMPOSITE" else ():  # full-object: the store computes it
        values = [p.checksums.get(alg) for p in parts]
        if all(values):
            checksums[alg] = composite_checksum(alg, values)  # type: ignore[arg-type]
    return ObjectMeta(
        bucket=upload.bucket, key=upload.key, size=sum(p.size for p in parts),
        etag=f'"{hashlib.md5(md5s).hexdigest()}-{len(parts)}"', last_modified=now,
        content_type=upload.spec.content_type, user_metadata=upload.spec.user_metadata,
        system_headers=upload.spec.system_headers, checksums=checksums, part_sizes=tuple(p.size for p in parts), owner=upload.owner,
        tags=upload.spec.tags, acl=upload.spec.acl,
    )


# -- delimiter grouping ------------------------------------------------------------------------

def common_prefix(key: str, prefix: str, delimiter: str) -> str | None:
    """The common prefix ``key`` rolls up into (through the first delimiter after ``prefix``), or None."""
    if not delimiter:
        return None
    i = key.find(delimiter, len(prefix))
    return key[: i + len(delimiter)] if i >= 0 else None


@dataclass(frozen=True)
class UploadPage:
    uploads: list[UploadInfo]
    common_prefixes: list[str]
    is_truncated: bool
    next_key_marker: str | None
    next_upload_id_marker: str | None


async def group_uploads(fetch: Callable[[str, str, int], Awaitable[list[UploadInfo]]], prefix: str, delimiter: str,
                        key_marker: str, upload_marker: str, limit: int) -> UploadPage:
    """One ListMultipartUploads page: uploads under ``prefix`` after the markers, rolled up by ``delimiter``.

    ``fetch(after_key, after_upload, n)`` returns the next ``n`` uploads in (key, upload id) order. A common
    prefix counts once, where its first upload falls; one at or before ``key_marker`` was on an earlier page.
    """
    uploads: list[UploadInfo] = []
    prefixes: list[str] = []
    marker: tuple[str, str | None] = (key_marker, None)  # the last element of this page
    last_key, last_upload = key_marker, upload_marker
    while True:
        batch = await fetch(last_key, last_upload, limit + 1)
        for u in batch:
            last_key, last_upload = u.key, u.upload_id
            cp = common_prefix(u.key, prefix, delimiter)
            if cp is not None and ((prefixes and prefixes[-1] == cp) or (key_marker and cp <= key_marker)):
                continue  # rolled into a prefix already returned (on this page or an earlier one)
            if len(uploads) + len(prefixes) >= limit:
                return UploadPage(uploads, prefixes, True, *marker)
            if cp is not None:
                prefixes.append(cp)
                marker = (cp, None)
            else:
                uploads.append(u)
                marker = (u.key, u.upload_id)
        if len(batch) <= limit:
            return UploadPage(uploads, prefixes, False, None, None)
