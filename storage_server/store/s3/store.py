"""The upstream S3 store: ObjectCache nodes in front of an existing S3-compatible object store.

Buckets and keys map one to one onto the upstream's; what ObjectCache adds (the owning
tenant, the region, immutable KV chunks) lives in the upstream too (:mod:`.buckets`,
:mod:`.objects`), so any number of nodes serve the same data. Bodies stream: up to
``part_bytes`` goes up as one PUT, anything longer as a multipart upload of parts that
size, and GETs stream the upstream's response. Multipart uploads pass through
(:mod:`.uploads`). Nothing is durable before the upstream has acknowledged it.

A conditional write (``If-None-Match: *`` / ``If-Match``) is checked against a HEAD when it
starts, so a failing one sends no bytes, and its condition goes to the upstream with the write
itself (PutObject, CompleteMultipartUpload, CopyObject), so the upstream decides atomically: the
upstream must enforce them, as AWS S3 and SeaweedFS do (moto ignores them on
CompleteMultipartUpload's ``If-Match`` and on CopyObject; there only the start's check holds).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from protocol.checksums import Digester
from protocol.config import S3StoreConfig
from protocol.errors import ErrorCode, S3Error

from ..lifecycle import LifecycleRule
from ..object_store import BodyStream, BucketInfo, ListPage, ObjectMeta, ObjectReader, ObjectStore, PutSpec, WriteCondition
from ..rules import check_immutable_reput, check_write_condition, verify_received
from .buckets import RESERVED, BucketMarkers, check_key, is_reserved
from .listing import list_page
from .objects import PartCutter, Stored, condition_args, open_upstream, put_args, quoted_etag, record_part_sizes, stored, with_acl, with_attributes
from .uploads import PartAttempts, UploadOps
from .upstream import Upstream

Listener = Callable[[str, list[str]], None]


class S3Store(UploadOps, ObjectStore):
    def __init__(self, cfg: S3StoreConfig) -> None:
        self.cfg = cfg
        self.up = Upstream(cfg)
        self.buckets = BucketMarkers(self.up, cfg.bucket_record_ttl_s, cfg.adoptions)
        self.attempts = PartAttempts()
        # Told (bucket, keys) after keys change through this process, so a chunk cache drops stale copies.
        self.listeners: list[Listener] = []

    def _changed(self, bucket: str, keys: list[str]) -> None:
        for fn in self.listeners:
            fn(bucket, keys)

    # -- buckets ---------------------------------------------------------------
    async def create_bucket(self, name: str, owner: str, region: str, acl: str = "private") -> None:
        await self.buckets.create(name, owner, region, self.cfg.region, acl)

    async def get_bucket(self, name: str) -> BucketInfo:
        return (await self.buckets.get(name)).info(name)

    async def bucket_id(self, name: str) -> str:
        """This incarnation of the bucket (NoSuchBucket if there is none)."""
        return (await self.buckets.get(name)).id

    async def delete_bucket(self, name: str) -> None:
        await self.buckets.get(name)
        if (await self.list_objects(name, limit=1)).objects:
            raise S3Error(ErrorCode.BucketNotEmpty, resource=f"/{name}", extra={"BucketName": name})
        for upload in await self._all_uploads(name, ""):
            await self.abort_upload(upload)
        rec = await self.buckets.remove(name)
        leftovers = [o.key for o in (await list_page(self.up, name, RESERVED, "", "", 1000, hide_reserved=False)).objects]
        await self._delete_keys(name, leftovers)
        try:
            await self.up.call("delete_bucket", Bucket=name, missing=ErrorCode.NoSuchBucket, resource=f"/{name}")
        except S3Error:
            await self.buckets.claim(name, rec)  # something was written meanwhile: the bucket stays, still its owner's
            raise

    async def list_buckets(self, owner: str, prefix: str = "", after: str = "", limit: int = 10000) -> list[BucketInfo]:
        return await self.buckets.list(owner, prefix, after, limit)

    async def probe(self) -> None:
        """Readiness: one upstream ListBuckets, however many buckets there are (no record is read)."""
        await self.up.call("list_buckets")

    async def bucket_names(self) -> list[str]:
        """The upstream's buckets that ObjectCache created (those with a bucket record)."""
        resp = await self.up.call("list_buckets")
        names = []
        for b in resp.get("Buckets", []):
            try:
                await self.buckets.get(b["Name"])
            except S3Error as e:
                if e.code is not ErrorCode.NoSuchBucket:
                    raise
                continue
            names.append(b["Name"])
        return sorted(names)

    # -- objects ---------------------------------------------------------------
    async def _existing(self, bucket: str, key: str) -> Stored | None:
        try:
            resp = await self.up.call("head_object", Bucket=bucket, Key=key, resource=f"/{bucket}/{key}")
        except S3Error as e:
            if e.code in (ErrorCode.NoSuchKey, ErrorCode.NoSuchBucket):
                return None
            raise
        return stored(bucket, key, resp)

    async def _refused(self, e: S3Error, condition: WriteCondition | None, bucket: str, key: str) -> S3Error | None:
        """The answer to an upstream's refusal of a conditional write, judged against the key as it is now: the
        condition's own failure (412, or 409 for an If-Match object deleted meanwhile), or None where it holds again
        (the upstream saw another state in between, or, for a copy, refused the source's condition)."""
        if condition is None or e.code not in (ErrorCode.PreconditionFailed, ErrorCode.NoSuchKey):
            return e
        current = await self._existing(bucket, key)
        try:
            check_write_condition(condition, current.meta if current else None, bucket, key, committing=True)
        except S3Error as judged:
            return judged
        return None

    async def _conditional(self, e: S3Error, condition: WriteCondition | None, bucket: str, key: str) -> S3Error:
        """A refused conditional put or completion: a condition that holds again was overtaken by a concurrent write (409, retry)."""
        judged = await self._refused(e, condition, bucket, key)
        return judged or S3Error(ErrorCode.ConditionalRequestConflict, resource=f"/{bucket}/{key}", extra={"Key": key})

    async def put_object(self, bucket: str, key: str, body: BodyStream, spec: PutSpec, owner: str,
                         condition: WriteCondition | None = None) -> ObjectMeta:
        """Stream ``body`` upstream; an immutable object already there accepts only identical bytes (then nothing is written)."""
        check_key(bucket, key)
        # A chunk put is conditional (If-None-Match), so only a plain put looks first for an immutable object in the way.
        existing = None if spec.immutable else await self._existing(bucket, key)
        check_write_condition(condition, existing.meta if existing else None, bucket, key)
        d = Digester(set(spec.checksum_algorithms) | set(spec.expected_checksums))
        cutter = PartCutter(body, self.cfg.part_bytes, d)
        first = await cutter.next() or b""
        try:
            if cutter.exhausted:
                return await self._put_whole(bucket, key, first, d, spec, owner, existing, condition)
            return await self._put_parts(bucket, key, first, cutter, spec, owner, existing, condition)
        except S3Error as e:
            if condition is None:
                raise
            raise await self._conditional(e, condition, bucket, key) from None

    def _candidate(self, bucket: str, key: str, d: Digester, spec: PutSpec, owner: str, etag: str) -> ObjectMeta:
        return ObjectMeta(bucket=bucket, key=key, size=d.size, etag=etag, last_modified=time.time(), content_type=spec.content_type,
                          user_metadata=spec.user_metadata, system_headers=spec.system_headers, checksums=d.checksum_values(), owner=owner)

    async def _put_whole(self, bucket: str, key: str, data: bytes, d: Digester, spec: PutSpec, owner: str, existing: Stored | None,
                         condition: WriteCondition | None) -> ObjectMeta:
        verify_received(spec, d)
        meta = self._candidate(bucket, key, d, spec, owner, f'"{d.md5.hexdigest()}"')
        if existing is not None and existing.immutable:
            check_immutable_reput(existing.meta, meta)
            return existing.meta
        extra: dict[str, Any] = {"IfNoneMatch": "*"} if spec.immutable else condition_args(condition)
        try:
            resp = await self.up.call("put_object", Bucket=bucket, Key=key, Body=data, ContentMD5=base64.b64encode(d.md5.digest()).decode(),
                                      missing=ErrorCode.NoSuchBucket, resource=f"/{bucket}/{key}",
                                      **put_args(spec, owner, d.checksum_values(), spec.immutable), **extra)
        except S3Error as e:
            if e.code != ErrorCode.PreconditionFailed or not spec.immutable:
                raise
            raced = await self._existing(bucket, key)  # another node put this chunk first: identical bytes are fine
            if raced is None:
                raise
            check_immutable_reput(raced.meta, meta)
            return raced.meta
        self._changed(bucket, [key])
        return replace(meta, etag=resp["ETag"])

    async def _put_parts(self, bucket: str, key: str, first: bytes, cutter: PartCutter, spec: PutSpec, owner: str,
                         existing: Stored | None, condition: WriteCondition | None) -> ObjectMeta:
        """A long body as an upstream multipart upload; aborted (nothing stored) if the body fails its checks."""
        resource = f"/{bucket}/{key}"
        # Only checksums the client declared up front can be stored: metadata is fixed at the start.
        created = await self.up.call("create_multipart_upload", Bucket=bucket, Key=key, missing=ErrorCode.NoSuchBucket, resource=resource,
                                     **put_args(spec, owner, spec.expected_checksums, spec.immutable))
        upload_id = created["UploadId"]
        try:
            parts: list[dict[str, Any]] = []
            piece: bytes | None = first
            while piece is not None:
                resp = await self.up.call("upload_part", Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=len(parts) + 1, Body=piece,
                                          resource=resource)
                parts.append({"PartNumber": len(parts) + 1, "ETag": resp["ETag"]})
                piece = await cutter.next()
            verify_received(spec, cutter.d)
            meta = self._candidate(bucket, key, cutter.d, spec, owner, f'"{cutter.d.md5.hexdigest()}"')
            if existing is not None and existing.immutable:
                check_immutable_reput(existing.meta, meta)
                await self._abort(bucket, key, upload_id)
                return existing.meta
            done = await self.up.call("complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id,
                                      MultipartUpload={"Parts": parts}, resource=resource, **condition_args(condition))
        except BaseException:
            await self._abort(bucket, key, upload_id)
            raise
        self._changed(bucket, [key])
        return replace(meta, etag=done["ETag"], checksums=dict(spec.expected_checksums))

    async def _abort(self, bucket: str, key: str, upload_id: str) -> None:
        try:
            await self.up.call("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
        except S3Error:
            pass  # best effort: the upstream's lifecycle rules reap abandoned uploads

    async def head_object(self, bucket: str, key: str) -> ObjectMeta:
        if is_reserved(key):
            raise S3Error(ErrorCode.NoSuchKey, resource=f"/{bucket}/{key}", extra={"Key": key})
        resp = await self.up.call("head_object", Bucket=bucket, Key=key, resource=f"/{bucket}/{key}")
        return await with_attributes(self.up, stored(bucket, key, resp))

    async def open_object(self, bucket: str, key: str, prefetch: int = 0) -> ObjectReader:
        if is_reserved(key):
            raise S3Error(ErrorCode.NoSuchKey, resource=f"/{bucket}/{key}", extra={"Key": key})
        return await open_upstream(self.up, bucket, key, prefetch)

    async def delete_object(self, bucket: str, key: str) -> None:
        await self.delete_many(bucket, [key])

    async def delete_many(self, bucket: str, keys: list[str]) -> None:
        keys = [k for k in keys if not is_reserved(k)]
        await self._delete_keys(bucket, keys)
        self._changed(bucket, keys)

    async def _delete_keys(self, bucket: str, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            batch = keys[i:i + 1000]
            resp = await self.up.call("delete_objects", Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                                      missing=ErrorCode.NoSuchBucket, resource=f"/{bucket}")
            for err in resp.get("Errors", []):
                raise S3Error(ErrorCode.ServiceUnavailable, f"The upstream store could not delete {err.get('Key')!r} ({err.get('Code')}); retry.")

    async def copy_object(self, src: ObjectMeta, bucket: str, key: str, spec: PutSpec, owner: str,
                          condition: WriteCondition | None = None) -> ObjectMeta:
        """A server-side copy of exactly ``src``'s version (``CopySourceIfMatch``), under new metadata.

        An immutable KV chunk at the destination stays one: only its own bytes may be copied onto it.
        """
        check_key(bucket, key)
        existing = await self._existing(bucket, key)
        check_write_condition(condition, existing.meta if existing else None, bucket, key)
        immutable = existing is not None and existing.immutable
        if immutable and (src.bucket, src.key) != (bucket, key):
            check_immutable_reput(existing.meta, replace(src, bucket=bucket, key=key))  # type: ignore[union-attr]
        try:
            resp = await self.up.call("copy_object", Bucket=bucket, Key=key, CopySource={"Bucket": src.bucket, "Key": src.key},
                                      CopySourceIfMatch=src.etag, MetadataDirective="REPLACE", TaggingDirective="REPLACE",
                                      missing=ErrorCode.NoSuchBucket, resource=f"/{bucket}/{key}", **condition_args(condition),
                                      **put_args(spec, owner, src.checksums, immutable, bool(src.part_sizes)))
        except S3Error as e:
            judged = await self._refused(e, condition, bucket, key)
            if judged is not None and judged is not e:
                raise judged from None
            if e.code == ErrorCode.PreconditionFailed:
                raise S3Error(ErrorCode.ServiceUnavailable, f"Object {src.key!r} was replaced while it was being copied; retry.") from None
            raise
        self._changed(bucket, [key])
        etag = quoted_etag(resp.get("CopyObjectResult", {}).get("ETag", src.etag))
        if src.part_sizes:  # a copy keeps the parts (the upstream's copy may be one part: the record says what they were)
            await record_part_sizes(self.up, bucket, key, etag, src.part_sizes)
        return ObjectMeta(bucket=bucket, key=key, size=src.size, etag=etag, last_modified=time.time(),
                          content_type=spec.content_type, user_metadata=spec.user_metadata, system_headers=spec.system_headers,
                          checksums=src.checksums, part_sizes=src.part_sizes, owner=owner, tags=spec.tags, acl=spec.acl)

    # -- tagging and canned ACLs -------------------------------------------------
    async def set_object_tags(self, bucket: str, key: str, tags: dict[str, str]) -> None:
        """The upstream's own object tags (PutObjectTagging / DeleteObjectTagging): every node reads them from there."""
        if is_reserved(key):
            raise S3Error(ErrorCode.NoSuchKey, resource=f"/{bucket}/{key}", extra={"Key": key})
        resource = f"/{bucket}/{key}"
        if tags:
            await self.up.call("put_object_tagging", Bucket=bucket, Key=key, resource=resource,
                               Tagging={"TagSet": [{"Key": k, "Value": v} for k, v in tags.items()]})
        else:
            await self.up.call("delete_object_tagging", Bucket=bucket, Key=key, resource=resource)

    async def set_object_acl(self, bucket: str, key: str, acl: str) -> None:
        """The ACL is the object's ``oc-acl`` metadata: a server-side copy onto itself of exactly the current version
        (``CopySourceIfMatch``), everything else kept (bytes, tags, immutability, recorded part sizes)."""
        current = await self._existing(bucket, key)
        if current is None or is_reserved(key):
            raise S3Error(ErrorCode.NoSuchKey, resource=f"/{bucket}/{key}", extra={"Key": key})
        if current.meta.acl == acl:
            return
        meta = await with_attributes(self.up, current)
        try:
            resp = await self.up.call("copy_object", Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": key}, CopySourceIfMatch=meta.etag,
                                      MetadataDirective="REPLACE", ContentType=meta.content_type, Metadata=with_acl(current.raw_metadata or {}, acl),
                                      resource=f"/{bucket}/{key}")
        except S3Error as e:
            if e.code == ErrorCode.PreconditionFailed:
                raise S3Error(ErrorCode.ServiceUnavailable, f"Object {key!r} was replaced while its ACL was set; retry.") from None
            raise
        etag = quoted_etag(resp.get("CopyObjectResult", {}).get("ETag", meta.etag))
        if meta.part_sizes and etag != meta.etag:
            await record_part_sizes(self.up, bucket, key, etag, meta.part_sizes)

    async def set_bucket_tags(self, bucket: str, tags: dict[str, str]) -> None:
        await self.buckets.update(bucket, tags=dict(tags))

    async def set_bucket_acl(self, bucket: str, acl: str) -> None:
        await self.buckets.update(bucket, acl=acl)

    async def set_bucket_lifecycle(self, bucket: str, rules: tuple[LifecycleRule, ...]) -> None:
        await self.buckets.update(bucket, lifecycle=tuple(rules))

    async def list_objects(self, bucket: str, prefix: str = "", delimiter: str = "", after: str = "", limit: int = 1000) -> ListPage:
        page = await list_page(self.up, bucket, prefix, delimiter, after, limit)
        owner = (await self.buckets.get(bucket)).owner  # only the bucket's owner writes to it
        return replace(page, objects=[replace(o, owner=owner) for o in page.objects])

    async def close(self) -> None:
        await self.up.close()
