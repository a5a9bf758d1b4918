"""Multipart uploads passed through to the upstream, with what S3 keeps about an upload that the upstream cannot.

The upstream holds the parts. The upload's owner and declared spec (checksum
algorithms, metadata) are needed again by whichever node serves a later part or the
completion, so they live beside the upload as ``.objectcache/uploads/<upload id>.json``
(a reserved key, hidden from listings) and go away when it completes or is aborted.
Completion applies the store-independent :func:`~storage_server.store.rules.select_parts`
to the upstream's part list, so errors are the same as with the local store.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from protocol.checksums import Digester
from protocol.errors import ErrorCode, S3Error

from ..object_store import BodyStream, ByteRange, ObjectMeta, PartInfo, PutSpec, UploadInfo
from ..rules import completed_meta, select_parts, verify_received
from .buckets import RESERVED, check_key
from .objects import PartCutter, put_args

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


def _spec_json(spec: PutSpec) -> dict[str, Any]:
    return {"content_type": spec.content_type, "user_metadata": spec.user_metadata, "system_headers": spec.system_headers,
            "checksum_algorithms": list(spec.checksum_algorithms), "immutable": spec.immutable}


def _no_upload(upload_id: str) -> S3Error:
    return S3Error(ErrorCode.NoSuchUpload, extra={"UploadId": upload_id})


class UploadOps:
    """The multipart operations of :class:`~storage_server.store.s3.store.S3Store`."""

    async def create_upload(self: "S3Store", bucket: str, key: str, spec: PutSpec, owner: str) -> UploadInfo:
        check_key(bucket, key)
        alg = _algorithm(spec)
        resp = await self.up.call("create_multipart_upload", Bucket=bucket, Key=key, missing=ErrorCode.NoSuchBucket, resource=f"/{bucket}/{key}",
                                  **put_args(spec, owner, {}, spec.immutable), **({"ChecksumAlgorithm": alg} if alg else {}))
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
                       checksum_algorithms=tuple(s["checksum_algorithms"]), immutable=s["immutable"])
        return UploadInfo(upload_id, bucket, key, float(raw["initiated"]), raw["owner"], spec)

    async def upload_part(self: "S3Store", upload: UploadInfo, part_number: int, body: BodyStream, spec: PutSpec) -> PartInfo:
        """One part, passed on as it arrives: a part longer than ``part_bytes`` is refused rather than buffered whole."""
        d = Digester(set(spec.checksum_algorithms) | set(upload.spec.checksum_algorithms) | set(spec.expected_checksums))
        cutter = PartCutter(body, self.cfg.part_bytes, d)
        data = await cutter.next() or b""
        if not cutter.exhausted:
            raise S3Error(ErrorCode.EntityTooLarge, f"Parts larger than {self.cfg.part_bytes} bytes are not accepted by this gateway.")
        verify_received(spec, d)
        alg = _algorithm(upload.spec)
        native = {f"Checksum{alg}": d.checksum_values()[alg]} if alg else {}  # kept by the upstream for the composite
        resp = await self.up.call("upload_part", Bucket=upload.bucket, Key=upload.key, UploadId=upload.upload_id, PartNumber=part_number,
                                  Body=data, missing=ErrorCode.NoSuchUpload, resource=f"/{upload.bucket}/{upload.key}", **native)
        return PartInfo(part_number, d.size, resp["ETag"], time.time(), d.checksum_values())

    async def upload_part_copy(self: "S3Store", upload: UploadInfo, part_number: int, src: ObjectMeta, rng: ByteRange | None) -> PartInfo:
        extra = {"CopySourceRange": f"bytes={rng.start}-{rng.end - 1}"} if rng else {}
        resp = await self.up.call("upload_part_copy", Bucket=upload.bucket, Key=upload.key, UploadId=upload.upload_id, PartNumber=part_number,
                                  CopySource={"Bucket": src.bucket, "Key": src.key}, CopySourceIfMatch=src.etag, missing=ErrorCode.NoSuchUpload,
                                  **extra)
        size = rng.length if rng else src.size
        return PartInfo(part_number, size, resp["CopyPartResult"]["ETag"], time.time())

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

    async def complete_upload(self: "S3Store", upload: UploadInfo, parts: list[tuple[int, str, dict[str, str]]]) -> ObjectMeta:
        stored = {p.part_number: (p, None) for p in await self._upstream_parts(upload)}
        chosen = [p for p, _ in select_parts(upload, parts, stored)]
        meta = completed_meta(upload, chosen, time.time())
        resp = await self.up.call("complete_multipart_upload", Bucket=upload.bucket, Key=upload.key, UploadId=upload.upload_id,
                                  MultipartUpload={"Parts": [{"PartNumber": p.part_number, "ETag": p.etag,
                                                              **{f"Checksum{a}": v for a, v in p.checksums.items()}} for p in chosen]},
                                  missing=ErrorCode.NoSuchUpload)
        await self._forget_upload(upload)
        self._changed(upload.bucket, [upload.key])
        return replace(meta, etag=resp.get("ETag", meta.etag))

    async def abort_upload(self: "S3Store", upload: UploadInfo) -> None:
        await self.up.call("abort_multipart_upload", Bucket=upload.bucket, Key=upload.key, UploadId=upload.upload_id, missing=ErrorCode.NoSuchUpload)
        await self._forget_upload(upload)

    async def _forget_upload(self: "S3Store", upload: UploadInfo) -> None:
        await self.up.call("delete_object", Bucket=upload.bucket, Key=_record_key(upload.upload_id))

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
