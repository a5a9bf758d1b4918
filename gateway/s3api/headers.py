"""HTTP header semantics of S3 objects: metadata, digests, ranges, conditions."""

from __future__ import annotations

import base64
import binascii
import re
from email.utils import parsedate_to_datetime

from multidict import CIMultiDictProxy

from gateway.auth.sigv4 import header_text
from protocol.checksums import ALGORITHMS
from protocol.errors import ErrorCode, S3Error
from storage_server.store import ByteRange, ObjectMeta, PutSpec, WriteCondition

from .access import canned_acl, tagging_header
from .xml import http_date

SYSTEM_HEADERS = ("Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language", "Expires")
MAX_METADATA_BYTES = 2048
CHECKSUM_LENGTHS = {"CRC32": 4, "CRC32C": 4, "CRC64NVME": 8, "SHA1": 20, "SHA256": 32}
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def user_metadata(headers: CIMultiDictProxy[str]) -> dict[str, str]:
    meta = {k.lower()[len("x-amz-meta-"):]: header_text(v) for k, v in headers.items() if k.lower().startswith("x-amz-meta-")}
    if sum(len(k) + len(v.encode()) for k, v in meta.items()) > MAX_METADATA_BYTES:
        raise S3Error(ErrorCode.MetadataTooLarge, extra={"MaxSizeAllowed": str(MAX_METADATA_BYTES)})
    return meta


def system_headers(headers: CIMultiDictProxy[str]) -> dict[str, str]:
    out = {}
    for name in SYSTEM_HEADERS:
        v = headers.get(name)
        if v is None:
            continue
        if name == "Content-Encoding":
            v = _without_aws_chunked(v)
            if not v:
                continue
        out[name] = v
    return out


def _without_aws_chunked(value: str) -> str:
    """Content-Encoding as sent, less the ``aws-chunked`` transfer coding (which describes this request's
    framing, not the object); everything else keeps its spelling and spacing (``deflate, gzip``)."""
    codings = value.split(",")
    if not any(c.strip().lower() == "aws-chunked" for c in codings):
        return value
    return ",".join(c for c in codings if c.strip().lower() != "aws-chunked").strip()


def content_md5(headers: CIMultiDictProxy[str]) -> bytes | None:
    v = headers.get("Content-MD5")
    if v is None:
        return None
    try:
        raw = base64.b64decode(v, validate=True)
    except binascii.Error:
        raw = b""
    if len(raw) != 16:
        raise S3Error(ErrorCode.InvalidDigest, "The Content-MD5 you specified is not valid.", extra={"Content-MD5": v})
    return raw


def checksum_request(headers: CIMultiDictProxy[str]) -> tuple[dict[str, str], tuple[str, ...], str | None]:
    """(expected values from headers, algorithms to compute, trailer header name)."""
    expected: dict[str, str] = {}
    algorithms: set[str] = set()
    for alg in ALGORITHMS:
        v = headers.get(f"x-amz-checksum-{alg.lower()}")
        if v is not None:
            _check_checksum_format(alg, v)
            expected[alg] = v
            algorithms.add(alg)
    sdk_alg = headers.get("x-amz-sdk-checksum-algorithm") or headers.get("x-amz-checksum-algorithm")
    if sdk_alg:
        if sdk_alg.upper() not in ALGORITHMS:
            raise S3Error(ErrorCode.InvalidRequest, f"Checksum algorithm {sdk_alg!r} is not supported.")
        algorithms.add(sdk_alg.upper())
    trailer = headers.get("x-amz-trailer")
    if trailer:
        trailer = trailer.strip().lower()
        alg = trailer.removeprefix("x-amz-checksum-").upper()
        if not trailer.startswith("x-amz-checksum-") or alg not in ALGORITHMS:
            raise S3Error(ErrorCode.InvalidRequest, f"The value specified in the x-amz-trailer header is not supported: {trailer}")
        algorithms.add(alg)
    return expected, tuple(sorted(algorithms)), trailer


def _check_checksum_format(alg: str, v: str) -> None:
    """A value that is not the algorithm's digest in base64 is ``BadDigest``, as S3 answers."""
    try:
        ok = len(base64.b64decode(v, validate=True)) == CHECKSUM_LENGTHS[alg]
    except binascii.Error:
        ok = False
    if not ok:
        raise S3Error(ErrorCode.BadDigest, f"Value for x-amz-checksum-{alg.lower()} header is invalid.")


def object_checksum_claims(headers: CIMultiDictProxy[str]) -> dict[str, str]:
    """CompleteMultipartUpload's ``x-amz-checksum-*`` headers: the whole object's value the client
    computed (COMPOSITE ``<base64>-<parts>`` or FULL_OBJECT ``<base64>``), not its XML body's."""
    claims = {}
    for alg in ALGORITHMS:
        v = headers.get(f"x-amz-checksum-{alg.lower()}")
        if v is not None:
            digest, dash, count = v.partition("-")
            if dash and not count.isdigit():
                raise S3Error(ErrorCode.BadDigest, f"Value for x-amz-checksum-{alg.lower()} header is invalid.")
            _check_checksum_format(alg, digest)
            claims[alg] = v
    return claims


def trailer_checksums(trailer: str | None, trailers: dict[str, str]) -> dict[str, str]:
    if not trailer:
        return {}
    if trailer not in trailers:
        raise S3Error(ErrorCode.InvalidRequest, f"The {trailer} trailer was declared but not sent.")
    alg = trailer.removeprefix("x-amz-checksum-").upper()
    _check_checksum_format(alg, trailers[trailer])
    return {alg: trailers[trailer]}


def put_spec(headers: CIMultiDictProxy[str], expected_size: int | None) -> tuple[PutSpec, str | None]:
    expected, algorithms, trailer = checksum_request(headers)
    spec = PutSpec(
        content_type=headers.get("Content-Type") or "binary/octet-stream",
        user_metadata=user_metadata(headers),
        system_headers=system_headers(headers),
        expected_md5=content_md5(headers),
        expected_checksums=expected,
        checksum_algorithms=algorithms,
        expected_size=expected_size,
        tags=tagging_header(headers),
        acl=canned_acl(headers),
    )
    return spec, trailer


def decoded_length(headers: CIMultiDictProxy[str], streaming: bool) -> int | None:
    name = "x-amz-decoded-content-length" if streaming else "Content-Length"
    v = headers.get(name)
    if v is None:
        return None
    try:
        n = int(v)
        if n < 0:
            raise ValueError
    except ValueError:
        raise S3Error(ErrorCode.InvalidArgument, f"{name} must be a non-negative integer.") from None
    return n


def parse_range(value: str | None, size: int) -> ByteRange | None:
    """RFC 7233 single byte range; malformed or multi-range headers are ignored as S3 does."""
    if not value:
        return None
    m = _RANGE.match(value.strip())
    if m is None:
        return None
    first, last = m.groups()
    if first == "" and last == "":
        return None
    if first == "":
        n = int(last)
        if n == 0 or size == 0:
            raise _unsatisfiable(value, size)
        return ByteRange(max(0, size - n), size)
    start = int(first)
    if last and int(last) < start:
        return None
    if start >= size:
        raise _unsatisfiable(value, size)
    end = size if last == "" else min(int(last) + 1, size)
    return ByteRange(start, end)


def _unsatisfiable(value: str, size: int) -> S3Error:
    return S3Error(ErrorCode.InvalidRange, extra={"RangeRequested": value, "ActualObjectSize": str(size)})


def _http_time(v: str | None) -> float | None:
    if not v:
        return None
    try:
        return parsedate_to_datetime(v).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


def _etag_matches(header: str, etag: str) -> bool:
    tags = [t.strip() for t in header.split(",")]
    return "*" in tags or etag in tags or etag.strip('"') in (t.strip('"') for t in tags)


def check_conditions(headers: CIMultiDictProxy[str], meta: ObjectMeta, prefix: str = "", copy_source: bool = False) -> None:
    """If-Match / If-None-Match / If-(Un)Modified-Since, with S3's precedence.

    ``prefix`` is ``x-amz-copy-source-`` for copy conditions, where every
    failure is 412.
    """
    mtime = int(meta.last_modified)
    if_match = headers.get(prefix + "If-Match")
    if_none = headers.get(prefix + "If-None-Match")
    if_unmod = _http_time(headers.get(prefix + "If-Unmodified-Since"))
    if_mod = _http_time(headers.get(prefix + "If-Modified-Since"))
    if if_match is not None:
        if not _etag_matches(if_match, meta.etag):
            raise S3Error(ErrorCode.PreconditionFailed, extra={"Condition": prefix + "If-Match"})
    elif if_unmod is not None and mtime > if_unmod:
        raise S3Error(ErrorCode.PreconditionFailed, extra={"Condition": prefix + "If-Unmodified-Since"})
    if if_none is not None:
        if _etag_matches(if_none, meta.etag):
            raise _not_modified(meta, prefix + "If-None-Match", copy_source)
    elif if_mod is not None and mtime <= if_mod:
        raise _not_modified(meta, prefix + "If-Modified-Since", copy_source)


def write_condition(headers: CIMultiDictProxy[str]) -> WriteCondition | None:
    """The condition of a PutObject, CompleteMultipartUpload or CopyObject (its destination), as S3 accepts it:
    ``If-None-Match: *`` or ``If-Match: <etag>``, one of them. Other forms are 501, as S3 answers them."""
    if_match, if_none = headers.get("If-Match"), headers.get("If-None-Match")
    if if_match is None and if_none is None:
        return None
    if if_match is not None and if_none is not None:
        raise S3Error(ErrorCode.NotImplemented, "A write may carry If-Match or If-None-Match, not both.", extra={"Header": "If-Match"})
    if if_none is not None:
        if if_none.strip() != "*":
            raise S3Error(ErrorCode.NotImplemented, "If-None-Match on a write accepts only '*' (write only if the key holds no object).",
                          extra={"Header": "If-None-Match"})
        return WriteCondition(if_none_match=True)
    assert if_match is not None
    if not if_match.strip():
        raise S3Error(ErrorCode.InvalidArgument, "If-Match must name an ETag.", extra={"ArgumentName": "If-Match", "ArgumentValue": if_match})
    return WriteCondition(if_match=if_match.strip())


def _not_modified(meta: ObjectMeta, condition: str, copy_source: bool) -> S3Error:
    """A copy condition fails with 412; a GET/HEAD answers 304 with the validators a cache revalidates with."""
    if copy_source:
        return S3Error(ErrorCode.PreconditionFailed, extra={"Condition": condition})
    return S3Error(ErrorCode.NotModified, headers={"ETag": meta.etag, "Last-Modified": http_date(meta.last_modified)})


def object_headers(meta: ObjectMeta, with_checksums: bool) -> dict[str, str]:
    h = {
        "ETag": meta.etag,
        "Last-Modified": http_date(meta.last_modified),
        "Content-Type": meta.content_type,
        "Accept-Ranges": "bytes",
    }
    h.update(meta.system_headers)
    for k, v in meta.user_metadata.items():
        h[f"x-amz-meta-{k}"] = v  # non-ASCII text is written by meta_encoding's responses
    if with_checksums:
        for alg, v in meta.checksums.items():
            h[f"x-amz-checksum-{alg.lower()}"] = v
        if meta.checksums:
            composite = any(v.rpartition("-")[2].isdigit() and "-" in v for v in meta.checksums.values())
            h["x-amz-checksum-type"] = "COMPOSITE" if composite else "FULL_OBJECT"
    if meta.part_sizes:
        h["x-amz-mp-parts-count"] = str(len(meta.part_sizes))
    if meta.tags:
        h["x-amz-tagging-count"] = str(len(meta.tags))
    return h


RESPONSE_OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-language": "Content-Language",
    "response-expires": "Expires",
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
}
