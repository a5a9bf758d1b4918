"""What ObjectCache remembers about an upstream bucket, kept in the bucket itself so every node sees it.

A bucket's owning tenant, its region and its incarnation id live in the object
``.objectcache/bucket.json`` inside the bucket. An object rather than bucket tags:
every S3-compatible store (AWS, MinIO, Ceph RGW, SeaweedFS, moto) implements objects
the same way, tags far less uniformly; a conditional ``PUT If-None-Match: *`` makes
claiming a bucket atomic across nodes; and the marker disappears with the bucket. Keys
under ``.objectcache/`` are reserved: hidden from listings, refused to tenants.

An upstream bucket without a marker is not an ObjectCache bucket (NoSuchBucket), and no
tenant may claim it with CreateBucket (BucketAlreadyExists): it holds someone else's data
unless the operator names it, with the one tenant who may claim it, in
``store.s3.adopt_buckets``. Records are read again for every ownership question unless
``store.s3.bucket_record_ttl_s`` allows a process to reuse one that long: a record is also
the bucket's incarnation, and a stale one would let a tenant into a bucket deleted and
recreated by another through another node. (A node that dies between creating the upstream
bucket and claiming it leaves such a bucket too: adopting it is the way back.)
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from protocol.errors import ErrorCode, S3Error

from ..lifecycle import LifecycleRule, rules_from_json, rules_to_json
from ..object_store import BucketInfo
from .upstream import Upstream

RESERVED = ".objectcache/"
MARKER = RESERVED + "bucket.json"
_LIST_CONCURRENCY = 16


def is_reserved(key: str) -> bool:
    return key.startswith(RESERVED)


def check_key(bucket: str, key: str) -> None:
    """A tenant may not write under the reserved prefix (nor name it on the KV path at all)."""
    if is_reserved(key):
        raise S3Error(ErrorCode.InvalidArgument, f"Keys under {RESERVED!r} are reserved by ObjectCache.", resource=f"/{bucket}/{key}",
                      extra={"ArgumentName": "key", "Key": key})


@dataclass(frozen=True)
class BucketRecord:
    owner: str
    region: str
    created: float
    id: str  # this incarnation: a bucket deleted and created again is another bucket to the chunk cache
    acl: str = "private"  # its canned ACL
    tags: dict[str, str] = field(default_factory=dict)
    lifecycle: tuple[LifecycleRule, ...] = ()

    def info(self, name: str) -> BucketInfo:
        return BucketInfo(name, self.owner, self.created, self.region, self.acl, dict(self.tags), self.id, self.lifecycle)

    def to_json(self) -> bytes:
        return json.dumps({**asdict(self), "lifecycle": rules_to_json(self.lifecycle)}).encode()


READ_EWMA = 0.3  # the newest record read's weight in ``read_s``


class BucketMarkers:
    def __init__(self, upstream: Upstream, ttl_s: float = 0.0, adoptions: dict[str, str] | None = None) -> None:
        self.up = upstream
        self.ttl_s = ttl_s
        self.adoptions = adoptions or {}  # upstream bucket without a record -> the tenant who may claim it
        self._cache: dict[str, tuple[BucketRecord, float]] = {}
        self.read_s: float | None = None  # a record read's time, an EWMA (what every request costs at ttl_s = 0)

    def _remember(self, name: str, rec: BucketRecord) -> None:
        if self.ttl_s > 0:
            self._cache[name] = (rec, time.monotonic() + self.ttl_s)

    async def _read(self, name: str) -> BucketRecord | None:
        """The marker (None if the bucket has none); NoSuchBucket if the upstream has no such bucket."""
        found = await self._read_versioned(name)
        return found[0] if found else None

    async def _read_versioned(self, name: str) -> tuple[BucketRecord, str] | None:
        """The marker and its ETag."""
        t0 = time.perf_counter()
        try:
            resp = await self.up.get(name, MARKER, missing=ErrorCode.NoSuchKey, resource=f"/{name}")
            data = await resp["Body"].read()
        except S3Error as e:
            if e.code == ErrorCode.NoSuchKey:
                return None
            raise
        took = time.perf_counter() - t0
        self.read_s = took if self.read_s is None else self.read_s + READ_EWMA * (took - self.read_s)
        raw = json.loads(data)
        return BucketRecord(str(raw["owner"]), str(raw["region"]), float(raw["created"]), str(raw["id"]), str(raw.get("acl", "private")),
                            {str(k): str(v) for k, v in (raw.get("tags") or {}).items()}, rules_from_json(raw.get("lifecycle"))), resp["ETag"]

    async def update(self, name: str, **changes: Any) -> None:
        """Change the bucket's record (its tags or ACL): a conditional rewrite of exactly the marker read (``If-Match``), so
        two nodes changing one bucket at once never undo each other; other nodes see it at their next read of the record."""
        for _ in range(5):
            found = await self._read_versioned(name)
            if found is None:
                raise S3Error(ErrorCode.NoSuchBucket, resource=f"/{name}", extra={"BucketName": name})
            rec = replace(found[0], **changes)
            try:
                await self.up.call("put_object", Bucket=name, Key=MARKER, Body=rec.to_json(), IfMatch=found[1],
                                   ContentType="application/json", missing=ErrorCode.NoSuchBucket, resource=f"/{name}")
            except S3Error as e:
                if e.code == ErrorCode.PreconditionFailed:
                    continue  # changed meanwhile by another node: apply this change to what it wrote
                raise
            self._remember(name, rec)
            return
        raise S3Error(ErrorCode.ServiceUnavailable, f"Bucket {name!r} kept changing while its record was updated; retry.", resource=f"/{name}")

    async def get(self, name: str) -> BucketRecord:
        hit = self._cache.get(name)
        if hit is not None and hit[1] > time.monotonic():
            return hit[0]
        rec = await self._read(name)
        if rec is None:
            raise S3Error(ErrorCode.NoSuchBucket, resource=f"/{name}", extra={"BucketName": name})
        self._remember(name, rec)
        return rec

    @staticmethod
    def _taken(name: str, rec: BucketRecord, owner: str) -> S3Error:
        code = ErrorCode.BucketAlreadyOwnedByYou if rec.owner == owner else ErrorCode.BucketAlreadyExists
        return S3Error(code, resource=f"/{name}", extra={"BucketName": name})

    async def create(self, name: str, owner: str, region: str, upstream_region: str, acl: str = "private") -> None:
        """Create the upstream bucket and claim it; a bucket already there is claimed only if the operator adopted it for ``owner``.

        (An upstream "create" of an existing bucket may succeed — us-east-1 answers 200 to its
        owner — so existence is asked first.)
        """
        if await self.up.bucket_exists(name):
            await self._may_adopt(name, owner)
        else:
            where = {} if upstream_region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": upstream_region}}
            try:
                await self.up.call("create_bucket", Bucket=name, resource=f"/{name}", **where)
            except S3Error as e:
                if e.code not in (ErrorCode.BucketAlreadyOwnedByYou, ErrorCode.BucketAlreadyExists):
                    raise
                await self._may_adopt(name, owner)  # created meanwhile, by another node or outside ObjectCache
        await self.claim(name, BucketRecord(owner, region, time.time(), uuid.uuid4().hex, acl))

    async def _may_adopt(self, name: str, owner: str) -> None:
        """An existing upstream bucket: the record's answer if it has one, else BucketAlreadyExists unless adopted for ``owner``."""
        refused = S3Error(ErrorCode.BucketAlreadyExists, resource=f"/{name}", extra={"BucketName": name})
        try:
            existing = await self._read(name)
        except S3Error as e:
            if e.code == ErrorCode.ServiceUnavailable:
                raise
            raise refused from None  # not readable with ObjectCache's credentials: someone else's bucket
        if existing is not None:
            raise self._taken(name, existing, owner)
        if self.adoptions.get(name) not in (owner, owner.partition("~")[0]):  # adoptions name the tenant; owner is its owner id
            raise refused

    async def claim(self, name: str, rec: BucketRecord) -> None:
        """Write the marker unless one exists (atomic at the upstream: the first claim wins)."""
        try:
            await self.up.call("put_object", Bucket=name, Key=MARKER, Body=rec.to_json(), IfNoneMatch="*",
                               ContentType="application/json", missing=ErrorCode.NoSuchBucket, resource=f"/{name}")
        except S3Error as e:
            if e.code != ErrorCode.PreconditionFailed:
                raise
            existing = await self._read(name)
            if existing is None:
                raise
            raise self._taken(name, existing, rec.owner) from None
        self._remember(name, rec)

    async def remove(self, name: str) -> BucketRecord:
        rec = await self.get(name)
        self._cache.pop(name, None)
        await self.up.call("delete_object", Bucket=name, Key=MARKER, missing=ErrorCode.NoSuchBucket, resource=f"/{name}")
        return rec

    async def list(self, owner: str, prefix: str, after: str, limit: int) -> list[BucketInfo]:
        """The owner's buckets: one upstream ListBuckets, then one marker read per candidate (bounded concurrency)."""
        resp = await self.up.call("list_buckets")
        names = sorted(b["Name"] for b in resp.get("Buckets", []) if b["Name"].startswith(prefix) and b["Name"] > after)
        gate = asyncio.Semaphore(_LIST_CONCURRENCY)

        async def one(name: str) -> BucketRecord | None:
            async with gate:
                try:
                    return await self.get(name)
                except S3Error as e:
                    if e.code == ErrorCode.NoSuchBucket:
                        return None
                    raise

        records = await asyncio.gather(*(one(n) for n in names))
        return [r.info(n) for n, r in zip(names, records) if r is not None and r.owner == owner][:limit]
