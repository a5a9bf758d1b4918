"""Multipart uploads passed through to the upstream, with what S3 keeps about an upload that the upstream cannot.

The upstream holds the parts. The upload's owner and declared spec (checksum
algorithms, metadata) are needed again by whichever node serves a later part or the
completion, so they live beside the upload as ``.objectcache/uploads/<upload id>.json``
(a reserved key, hidden from listings) and go away when it completes or is aborted.
Completion applies the store-independent :func:`~storage_server.store.rules.select_parts`
to the upstream's part list, so errors are the same as with the local store, and never
turns an immutable KV chunk into other bytes (the key is looked at just before the
upstream completes; a chunk put in that instant is the one window left).

Of two attempts at one part the one *started* last is the upstream's part, although the
upstream keeps the one that *finished* last: each attempt writes a claim
``.objectcache/uploads/<id>.parts/<n>`` (its start time) when it starts, and sends its
bytes upstream only if no later attempt has claimed the part by then; within a process
a lock per part also keeps an earlier attempt from sending after a later one. An earlier
attempt's bytes are kept beside the upload as ``.objectcache/uploads/<id>.attempts/<n>/<md5>``
instead, since the client may complete with its ETag (a re-sent part whose first attempt
finished last): completion copies the attempt it names into the part (UploadPartCopy), and
completion or abort deletes every attempt. Across nodes two attempts whose upstream
transfers overlap can still finish in either order.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from protocol.checksums import Digester
from protocol.errors import ErrorCode, S3Error

from ..object_store import BodyStream, ByteRange, ObjectMeta, PartInfo, PutSpec, UploadInfo, WriteCondition
from ..rules import check_immutable_reput, check_write_condition, completed_meta, select_parts, verify_received
from .buckets import RESERVED, check_key
from .listing import list_page
from .objects import PartCutter, condition_args, put_args, quoted_etag, record_part_sizes

if TYPE_CHECKING:
    from .store import S3Store

_RECORDS = RESERVED + "uploads/"
_NATIVE = ("CRC32", "CRC32C", "SHA1", "SHA256", "CRC64NVME")  # checksums the S3 API carries per part


def _algorithm(spec: PutSpec) -> str | None:
    """The one checksum algorithm an upload declares, if the upstream can keep it per part."""
    algs = [a for a in spec.checksum_algorithms if a in _NATIVE]
    return algs[0] if algs else None


def _record_key(upload_id: str) -> str:
    return _RECORDS + upload_id.replace("/", "_") + ".json"


def _claims(upload_id: str) -> str:
    """The prefix of an upload's part claims."""
    return _RECORDS + upload_id.replace("/", "_") + ".parts/"


def _attempts(upload_id: str) -> str:
    """The prefix of an upload's kept earlier attempts, ``<part number>/<md5 hex>`` under it."""
    return _RECORDS + upload_id.replace("/", "_") + ".attempts/"


class PartAttempts:
    """This process's attempts at each (upload, part): which started last, and one lock per part while any is running."""

    def __init__(self) -> None:
        self._count = 0
        self._latest: dict[tuple[str, int], int] = {}
        self._running: dict[tuple[str, int], int] = {}
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}

    def start(self, part: tuple[str, int]) -> int:
        self._count += 1
        self._latest[part] = self._count
        self._running[part] = self._running.get(part, 0) + 1
        return self._count

    def is_latest(self, part: tuple[str, int], attempt: int) -> bool:
        return self._latest.get(part) == attempt

    def lock(self, part: tuple[str, int]) -> asyncio.Lock:
        return self._locks.setdefault(part, asyncio.Lock())

    def end(self, part: tuple[str, int]) -> None:
        self._running[part] -= 1
        if not self._running[part]:
            for d in (self._running, self._latest, self._locks):
                d.pop(part, None)


def _spec_json(spec: PutSpec) -> dict[str, Any]:
    return {"content_type": spec.content_type, "user_metadata": spec.user_metadata, "system_headers": spec.system_headers,
            "checksum_algorithms": list(spec.checksum_algorithms), "immutable": spec.immutable, "tags": spec.tags, "acl": spec.acl}


def _no_upload(upload_id: str) -> S3Error:
    return S3Error(ErrorCode.NoSuchUpload, extra={"UploadId": upload_id})


class UploadOps:
    """The multipart operations of :class:`~storage_server.store.s3.store.S3Store`."""

    async def create_upload(self: "S3Store", bucket: str, key: str, spec: PutSpec, owner: str) -> UploadInfo:
        check_key(bucket, key)
        alg = _algorithm(spec)
        resp = await self.up.call("create_multipart_upload", Bucket=bucket, Key=key, missing=ErrorCode.NoSuchBucket, resource=f"/{bucket}/{key}",
                                  **put_args(spec, owner, {}, spec.immutable, multipart=True), **({"ChecksumAlgorithm": alg} if alg else {}))
        info = UploadInfo(resp["UploadId"], bucket, key, time.time(), owner, spec)
        record = {"key": key, "owner": owner, "initiated": info.initiated, "spec": _spec_json(spec)}
        await self.up.call("put_object", Bucket=bucket, Key=_record_key(info.upload_id), Body=json.dumps(record).encode(),
                           ContentType="application/json")
        return info

    async def get_upload(self: "S3Store", bucket: str, key: str, upload_id: str) -> UploadInfo:
        try:
            resp = await self.up.call("get_object", Bucket=bucket, Key=_record_key(upload_id), resource=f"/{bucket}/{key}")
            raw = json.loads(await resp["Body"].read())
        except S3Error as e:
            if e.code == ErrorCode.NoSuchKey:
                raise _no_upload(upload_id) from None
            raise
        if raw["key"] != key:
            raise _no_upload(upload_id)
        s = raw["spec"]
        spec = PutSpec(content_type=s["content_type"], user_metadata=s["user_metadata"], system_headers=s["system_headers"],
                       checksum_algorithms=tuple(s["checksum_algorithms"]), immutable=s["immutable"], tags=s.get("tags", {}),
                       acl=s.get("acl", "private"))
        return UploadInfo(upload_id, bucket, key, float(raw["initiated"]), raw["owner"], spec)

    async def upload_part(self: "S3Store", upload: UploadInfo, part_number: int, body: BodyStream, spec: PutSpec) -> PartInfo:
        """One part, passed on as it arrives: a part longer than ``part_bytes`` is refused rather than buffered whole."""
        part = (upload.upload_id, part_number)
        attempt = self.attempts.start(part)
        try:
            return await self._upload_part(upload, part_number, body, spec, attempt)
        finally:
            self.attempts.end(part)

    async def _upload_part(self: "S3Store", upload: UploadInfo, part_number: int, body: BodyStream, spec: PutSpec, attempt: int) -> PartInfo:
        part, resource = (upload.upload_id, part_number), f"/{upload.bucket}/{upload.key}"
        claim, started = f"{_claims(upload.upload_id)}{part_number}", f"{time.time_ns():020d}-{uuid.uuid4().hex}"
        await self.up.call("put_object", Bucket=upload.bucket, Key=claim, Body=started.encode(), resource=resource)
        d = Digester(set(spec.checksum_algorithms) | set(upload.spec.checksum_algorithms) | set(spec.expected_checksums))
        cutter = PartCutter(body, self.cfg.part_bytes, d)
        data = await cutter.next() or b""
        if not cutter.exhausted or d.size > self.cfg.part_bytes:  # a part is cut at piece boundaries: it may run past
            raise S3Error(ErrorCode.EntityTooLarge, f"Parts larger than {self.cfg.part_bytes} bytes are not accepted by this gateway.")
        verify_received(spec, d)
        alg = _algorithm(upload.spec)
        native = {f"Checksum{alg}": d.checksum_values()[alg]} if alg else {}  # kept by the upstream for the composite
        async with self.attempts.lock(part):
            if not self.attempts.is_latest(part, attempt) or await self._claimed_after(upload, claim, started):
                # A later attempt at this part has started: it is the upstream's part, this one is kept aside.
                await self.up.call("put_object", Bucket=upload.bucket, Key=f"{_attempts(upload.upload_id)}{part_number}/{d.md5.hexdigest()}",
                                   Body=data, Metadata={"oc-checksums": json.dumps(d.checksum_values())}, resource=resource)
                return PartInfo(part_number, d.size, f'"{d.md5.hexdigest()}"', time.time(), d.checksum_values())
            resp = await self.up.call("upload_part", Bucket=upload.bucket, Key=upload.key, UploadId=upload.upload_id, PartNumber=part_number,
                                      Body=data, missing=ErrorCode.NoSuchUpload, resource=resource, **native)
        return PartInfo(part_number, d.size, resp["ETag"], time.time(), d.checksum_values())

    async def _claimed_after(self: "S3Store", upload: UploadInfo, claim: str, started: str) -> bool:
        """Whether an attempt that started after ``started`` (on any node) has claimed the part."""
        try:
            resp = await self.up.call("get_object", Bucket=upload.bucket, Key=claim)
            return (await resp["Body"].read()).decode() > started
        except S3Error as e:
            if e.code == ErrorCode.NoSuchKey:  # the upload completed or was aborted meanwhile: the upstream says so next
                return False
            raise

    async def upload_part_copy(self: "S3Store", upload: UploadInfo, part_number: int, src: ObjectMeta, rng: ByteRange | None) -> PartInfo:
        extra = {"CopySourceRange": f"bytes={rng.start}-{rng.end - 1}"} if rng else {}
        resp = await self.up.call("upload_part_copy", Bucket=upload.bucket, Key=upload.key, UploadId=upload.upload_id, PartNumber=part_number,
                                  CopySource={"Bucket": src.bucket, "Key": src.key}, CopySourceIfMatch=src.etag, missing=ErrorCode.NoSuchUpload,
                                  **extra)
        size = rng.length if rng else src.size
        return PartInfo(part_number, size, quoted_etag(resp["CopyPartResult"]["ETag"]), time.time())

    async def _upstream_parts(self: "S3Store", upload: UploadInfo, after: int = 0, limit: int = 10000) -> list[PartInfo]:
        parts: list[PartInfo] = []
        marker = after
        while len(parts) < limit:
            resp = await self.up.call("list_parts", Bucket=upload.bucket, Key=upload.key, UploadId=upload.upload_id, PartNumberMarker=marker,
                                      MaxParts=min(1000, limit - len(parts)), missing=ErrorCode.NoSuchUpload)
            parts += [PartInfo(int(p["PartNumber"]), int(p["Size"]), p["ETag"], p["LastModified"].timestamp(),
                               {a: p[f"Checksum{a}"] for a in _NATIVE if p.get(f"Checksum{a}")}) for p in resp.get("Parts", [])]
            if not resp.get("IsTruncated") or not resp.get("Parts"):
                break
            marker = int(resp["NextPartNumberMarker"])
        return parts

    async def list_parts(self: "S3Store", upload: UploadInfo, after: int = 0, limit: int = 1000) -> list[PartInfo]:
        return await self._upstream_parts(upload, after, limit)

    async def complete_upload(self: "S3Store", upload: UploadInfo, parts: list[tuple[int, str, dict[str, str]]],
                              condition: WriteCondition | None = None) -> ObjectMeta:
        stored: dict[int, tuple[PartInfo, str | None]] = {p.part_number: (p, None) for p in await self._upstream_parts(upload)}
        kept = await list_page(self.up, upload.bucket, _attempts(upload.upload_id), "", "", 10000, hide_reserved=False)
        attempts = [(PartInfo(int(n), o.size, f'"{md5}"', o.last_modified), o.key)
                    for o in kept.objects for n, _, md5 in [o.key[len(_attempts(upload.upload_id)):].partition("/")]]
        chosen = [await self._into_part(upload, p, key) if key else p for p, key in select_parts(upload, parts, stored, attempts)]
        meta = completed_meta(upload, chosen, time.time())
        existing = await self._existing(upload.bucket, upload.key)
        check_write_condition(condition, existing.meta if existing else None, upload.bucket, upload.key)
        if existing is not None and existing.immutable:
            check_immutable_reput(existing.meta, meta)  # an upload never replaces a KV chunk's bytes
            await self.abort_upload(upload)  # the same bytes: the chunk stays as it is
            return existing.meta
        try:
            resp = await self.up.call("complete_multipart_upload", Bucket=upload.bucket, Key=upload.key, UploadId=upload.upload_id,
                                      MultipartUpload={"Parts": [{"PartNumber": p.part_number, "ETag": p.etag,
                                                                  **{f"Checksum{a}": v for a, v in p.checksums.items()}} for p in chosen]},
                                      missing=ErrorCode.NoSuchUpload, **condition_args(condition))
        except S3Error as e:
            if condition is None:
                raise
            raise await self._conditional(e, condition, upload.bucket, upload.key) from None
        etag = resp.get("ETag", meta.etag)
        await record_part_sizes(self.up, upload.bucket, upload.key, etag, meta.part_sizes)
        await self._forget_upload(upload)
        self._changed(upload.bucket, [upload.key])
        return replace(meta, etag=etag)

    async def _into_part(self: "S3Store", upload: UploadInfo, part: PartInfo, key: str) -> PartInfo:
        """A kept attempt made the upstream's part (a server-side copy), with the checksums it was received with."""
        head = await self.up.call("head_object", Bucket=upload.bucket, Key=key, missing=ErrorCode.InvalidPart)
        checksums = json.loads((head.get("Metadata") or {}).get("oc-checksums", "{}"))
        resp = await self.up.call("upload_part_copy", Bucket=upload.bucket, Key=upload.key, UploadId=upload.upload_id,
                                  PartNumber=part.part_number, CopySource={"Bucket": upload.bucket, "Key": key}, missing=ErrorCode.NoSuchUpload)
        return replace(part, etag=quoted_etag(resp["CopyPartResult"]["ETag"]), checksums=checksums)

    async def abort_upload(self: "S3Store", upload: UploadInfo) -> None:
        await self.up.call("abort_multipart_upload", Bucket=upload.bucket, Key=upload.key, UploadId=upload.upload_id, missing=ErrorCode.NoSuchUpload)
        await self._forget_upload(upload)

    async def _forget_upload(self: "S3Store", upload: UploadInfo) -> None:
        claims = await list_page(self.up, upload.bucket, _claims(upload.upload_id), "", "", 10000, hide_reserved=False)
        kept = await list_page(self.up, upload.bucket, _attempts(upload.upload_id), "", "", 10000, hide_reserved=False)
        await self._delete_keys(upload.bucket, [_record_key(upload.upload_id), *(o.key for o in claims.objects + kept.objects)])

    async def _all_uploads(self: "S3Store", bucket: str, prefix: str) -> list[UploadInfo]:
        """Every upload in progress under ``prefix``, in (key, upload id) order (a page at a time from the upstream)."""
        owner = (await self.buckets.get(bucket)).owner
        out: list[UploadInfo] = []
        args: dict[str, Any] = {"Bucket": bucket, **({"Prefix": prefix} if prefix else {})}
        while True:
            resp = await self.up.call("list_multipart_uploads", missing=ErrorCode.NoSuchBucket, resource=f"/{bucket}", **args)
            out += [UploadInfo(u["UploadId"], bucket, u["Key"], u["Initiated"].timestamp(), owner, PutSpec()) for u in resp.get("Uploads", [])]
            if not resp.get("IsTruncated"):
                break
            args = {**args, "KeyMarker": resp["NextKeyMarker"], "UploadIdMarker": resp.get("NextUploadIdMarker", "")}
        return sorted(out, key=lambda u: (u.key.encode(), u.upload_id))

    async def list_uploads(self: "S3Store", bucket: str, prefix: str = "", after_key: str = "", after_upload: str = "",
                           limit: int = 1000) -> list[UploadInfo]:
        """Uploads after (key, upload id), ordered as the local store orders them (the upstream orders a key's uploads by time)."""
        mark = (after_key.encode(), after_upload)
        return [u for u in await self._all_uploads(bucket, prefix) if (u.key.encode(), u.upload_id) > mark][:limit]
