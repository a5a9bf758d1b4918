"""Objects at the upstream: what ObjectCache stores beside the bytes, bodies cut into parts, and streamed reads.

The upstream sees one credential (ObjectCache's), so the tenant that wrote an object,
whether it is an immutable KV chunk, its S3 checksums, its system headers and its canned
ACL travel as reserved user-metadata entries (``x-amz-meta-oc-*``) and are stripped again
on read. An ACL is ObjectCache's to enforce (tenants never reach the upstream, so the
upstream's own ACLs would mean nothing); it is read with every HEAD and GET, so a change
through any node holds on every node at once. Tags are the upstream's own object tags
(read only when the upstream counts some). The part sizes of a multipart object are
written at completion as ``.objectcache/parts/<sha256 of key>.json`` with the object's
ETag, so every node can serve GET/HEAD by part number; a record whose ETag is not the
object's is stale and ignored.
"""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from protocol.checksums import Digester
from protocol.errors import ErrorCode, S3Error

from ..object_store import BodyStream, ByteRange, ObjectMeta, ObjectReader, PutSpec, WriteCondition
from ..rules import MAX_PUT_SIZE
from .upstream import Upstream, body_chunks

_OWNER, _IMMUTABLE, _CHECKSUMS, _SYSTEM, _ACL, _MULTIPART = "oc-owner", "oc-immutable", "oc-checksums", "oc-system", "oc-acl", "oc-multipart"
_RESERVED_META = (_OWNER, _IMMUTABLE, _CHECKSUMS, _SYSTEM, _ACL, _MULTIPART)
PARTS = ".objectcache/parts/"


@dataclass(frozen=True)
class Stored:
    """An upstream object as ObjectCache sees it."""

    meta: ObjectMeta
    immutable: bool
    tag_count: int = 0
    multipart: bool = False  # completed from a client's multipart upload: its part sizes are recorded
    raw_metadata: dict[str, str] | None = None  # as the upstream holds it (kept by an ACL change)


def _ascii(value: str) -> str:
    """A metadata value the upstream can carry as a header: non-ASCII text RFC 2047-encoded, as S3 itself returns it."""
    return value if value.isascii() else f"=?UTF-8?B?{base64.b64encode(value.encode()).decode()}?="


def _text(value: str) -> str:
    if value.startswith("=?UTF-8?B?") and value.endswith("?="):
        try:
            return base64.b64decode(value[10:-2], validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            pass
    return value


def quoted_etag(etag: str) -> str:
    """An ETag as S3 writes it, in double quotes (SeaweedFS answers CopyObject/UploadPartCopy without them)."""
    return etag if etag.startswith('"') or etag.startswith('W/"') else f'"{etag}"'


def put_args(spec: PutSpec, owner: str, checksums: dict[str, str], immutable: bool, multipart: bool = False) -> dict[str, Any]:
    """ContentType, Metadata and Tagging for an upstream PUT, copy or multipart upload."""
    metadata = {k: _ascii(v) for k, v in spec.user_metadata.items() if k.lower() not in _RESERVED_META} | {_OWNER: _ascii(owner)}
    if immutable:
        metadata[_IMMUTABLE] = "1"
    if multipart:
        metadata[_MULTIPART] = "1"
    if spec.acl != "private":
        metadata[_ACL] = spec.acl
    if checksums:
        metadata[_CHECKSUMS] = json.dumps(checksums, separators=(",", ":"))
    if spec.system_headers:
        metadata[_SYSTEM] = json.dumps(spec.system_headers, separators=(",", ":"))
    return {"ContentType": spec.content_type, "Metadata": metadata, **({"Tagging": urllib.parse.urlencode(spec.tags)} if spec.tags else {})}


def condition_args(condition: WriteCondition | None) -> dict[str, str]:
    """A conditional write's condition as the upstream request's own (IfNoneMatch / IfMatch), for the upstream to enforce."""
    if condition is None:
        return {}
    if condition.if_none_match:
        return {"IfNoneMatch": "*"}
    return {"IfMatch": condition.if_match} if condition.if_match is not None else {}


def with_acl(raw_metadata: dict[str, str], acl: str) -> dict[str, str]:
    """An object's upstream metadata with another canned ACL."""
    return {k: v for k, v in raw_metadata.items() if k != _ACL} | ({_ACL: acl} if acl != "private" else {})


def stored(bucket: str, key: str, resp: dict[str, Any]) -> Stored:
    """A HEAD or GET response as :class:`Stored`."""
    raw = dict(resp.get("Metadata") or {})
    meta = ObjectMeta(
        bucket=bucket, key=key, size=int(resp.get("ContentLength", 0)), etag=resp["ETag"],
        last_modified=resp["LastModified"].timestamp(), content_type=resp.get("ContentType") or "binary/octet-stream",
        user_metadata={k: _text(v) for k, v in raw.items() if k not in _RESERVED_META},
        system_headers=json.loads(raw.get(_SYSTEM, "{}")), checksums=json.loads(raw.get(_CHECKSUMS, "{}")),
        storage_class=resp.get("StorageClass") or "STANDARD", owner=_text(raw.get(_OWNER, "")), acl=raw.get(_ACL, "private"),
    )
    if "ContentRange" in resp:  # a ranged GET: the object's size is after the slash
        meta = replace(meta, size=int(resp["ContentRange"].rsplit("/", 1)[1]))
    return Stored(meta, raw.get(_IMMUTABLE) == "1", int(resp.get("TagCount") or 0), raw.get(_MULTIPART) == "1", raw)


def parts_key(key: str) -> str:
    return PARTS + hashlib.sha256(key.encode()).hexdigest() + ".json"


async def record_part_sizes(up: Upstream, bucket: str, key: str, etag: str, sizes: tuple[int, ...]) -> None:
    await up.call("put_object", Bucket=bucket, Key=parts_key(key), Body=json.dumps({"key": key, "etag": etag, "sizes": sizes}).encode(),
                  ContentType="application/json", missing=ErrorCode.NoSuchBucket, resource=f"/{bucket}/{key}")


async def with_attributes(up: Upstream, st: Stored) -> ObjectMeta:
    """The object's metadata with its tags and part sizes, each read from the upstream only where the object has some."""
    meta, resource = st.meta, f"/{st.meta.bucket}/{st.meta.key}"
    if st.tag_count:
        resp = await up.call("get_object_tagging", Bucket=meta.bucket, Key=meta.key, resource=resource)
        meta = replace(meta, tags={t["Key"]: t["Value"] for t in resp.get("TagSet", [])})
    if st.multipart:
        try:
            resp = await up.call("get_object", Bucket=meta.bucket, Key=parts_key(meta.key), resource=resource)
            record = json.loads(await resp["Body"].read())
        except S3Error as e:
            if e.code != ErrorCode.NoSuchKey:
                raise
            record = {}  # completed by a node that stopped before recording the sizes: served as one part
        if record.get("key") == meta.key and record.get("etag") == meta.etag:
            meta = replace(meta, part_sizes=tuple(int(n) for n in record["sizes"]))
    return meta


class PartCutter:
    """Cuts a body into parts of at least ``size`` bytes at the body's own piece boundaries, digesting everything it reads.

    S3 parts may differ in size (all but the last at least 5 MiB), so a part is whole
    pieces joined once: one copy, at most one part plus one piece of read-ahead in memory
    (the read-ahead tells whether the body ends with this part).
    """

    def __init__(self, body: BodyStream, size: int, digester: Digester) -> None:
        self._it = aiter(body)
        self.size, self.d = size, digester
        self._pieces: list[bytes] = []
        self._held = 0
        self.ended = False

    async def _read(self) -> bool:
        try:
            piece = await anext(self._it)
        except StopAsyncIteration:
            self.ended = True
            return False
        self.d.update(piece)
        if self.d.size > MAX_PUT_SIZE:
            raise S3Error(ErrorCode.EntityTooLarge, extra={"MaxSizeAllowed": str(MAX_PUT_SIZE)})
        if piece:
            self._pieces.append(piece)
            self._held += len(piece)
        return True

    async def next(self) -> bytes | None:
        """The next part, or None once the body is exhausted."""
        while not self.ended and self._held < self.size:
            await self._read()
        if not self._pieces:
            return None
        part, self._pieces, self._held = b"".join(self._pieces), [], 0
        if not self.ended:
            await self._read()  # read-ahead: does the body end with this part?
        return part

    @property
    def exhausted(self) -> bool:
        return self.ended and not self._pieces


class UpstreamReader(ObjectReader):
    """One version of an upstream object: the open GET streams on; other ranges are re-read with ``If-Match``.

    ``If-Match`` on the object's ETag keeps a later range of a replaced object from
    pairing new bytes with this metadata: the read fails with 503 instead.
    """

    def __init__(self, up: Upstream, meta: ObjectMeta, body: Any, head: bytes) -> None:
        self._up, self.meta, self._body, self.head = up, meta, body, head
        self._pos = len(head)  # where the open body continues

    async def stream(self, rng: ByteRange | None = None, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        start, end = (rng.start, rng.end) if rng else (0, self.meta.size)
        if start < len(self.head):
            yield self.head[start:min(end, len(self.head))]
            start = min(end, len(self.head))
        if start >= end:
            return
        resource = f"/{self.meta.bucket}/{self.meta.key}"
        if self._body is not None and start == self._pos:
            body, self._body = self._body, None
            async for piece in body_chunks(body, chunk_size, resource):
                take = piece[: end - start]
                start += len(take)
                yield take
                if start >= end:
                    break
            body.close()
            return
        try:
            resp = await self._up.call("get_object", Bucket=self.meta.bucket, Key=self.meta.key, Range=f"bytes={start}-{end - 1}",
                                       IfMatch=self.meta.etag, resource=resource)
        except S3Error as e:
            if e.code == ErrorCode.PreconditionFailed:
                raise S3Error(ErrorCode.ServiceUnavailable, "The object was replaced while it was read; retry.", resource) from None
            raise
        try:
            async for piece in body_chunks(resp["Body"], chunk_size, resource):
                yield piece
        finally:
            resp["Body"].close()

    def close(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            body.close()


async def open_upstream(up: Upstream, bucket: str, key: str, prefetch: int) -> UpstreamReader:
    """GET the object; its metadata and first ``prefetch`` bytes come from the one response."""
    resource = f"/{bucket}/{key}"
    resp = await up.call("get_object", Bucket=bucket, Key=key, resource=resource)
    body = resp["Body"]
    head = bytearray()
    try:
        meta = await with_attributes(up, stored(bucket, key, resp))
        if prefetch:
            async for piece in body_chunks(body, min(prefetch, 1 << 20), resource):
                head += piece
                if len(head) >= min(prefetch, meta.size):
                    break
    except BaseException:
        body.close()
        raise
    return UpstreamReader(up, meta, body, bytes(head))
