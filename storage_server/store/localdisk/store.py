"""The embedded local-disk store: object bytes in durable blob files, metadata in the SQLite index.

The gateway (plain S3) and the storage server (KV chunks) open the same data
directory. Durability follows :mod:`.blobs`; readers never see a row whose file
is incomplete; crash leftovers are cleaned by :mod:`.cleanup`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from protocol.checksums import Digester
from protocol.errors import ErrorCode, S3Error

from ..lifecycle import LifecycleRule, rules_to_json
from ..object_store import BodyStream, BucketInfo, ByteRange, ListPage, ObjectMeta, ObjectReader, ObjectStore, PartInfo, PutSpec, UploadInfo, WriteCondition
from ..rules import MAX_PUT_SIZE, check_write_condition, completed_meta, select_parts, verify_received
from . import cleanup
from .blobs import WRITE_BUFFER, BlobFiles
from .group_commit import GroupCommit
from .index import MetadataIndex, Published

T = TypeVar("T")


class LocalDiskStore(ObjectStore):
    def __init__(self, data_dir: str | os.PathLike, io_threads: int) -> None:
        self.root = Path(data_dir).resolve()
        self.blobs = BlobFiles(self.root)
        cleanup.sweep_tmp(self.blobs.tmp_dir)
        self.index = MetadataIndex(self.root / "meta.sqlite3")
        self._group = GroupCommit(self.blobs, self.index)  # concurrent PUTs share their barriers
        self._pool = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="localdisk")

    async def _run(self, fn: Callable[..., T], *args) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def reclaim_orphans(self, grace_s: float = cleanup.GRACE_S) -> int:
        return await self._run(cleanup.reclaim_orphans, self.blobs.objects_dir, self.index.referenced_names, grace_s)

    def _commit(self, bucket: str, published: list[Published]) -> list[ObjectMeta]:
        """Published files become visible in one transaction; replaced files are unlinked after it."""
        try:
            results, garbage = self.index.commit(bucket, published)
        except BaseException:
            for final, *_ in published:
                final.unlink(missing_ok=True)
            raise
        for g in garbage:
            Path(g).unlink(missing_ok=True)
        return results

    # -- buckets ---------------------------------------------------------------
    async def create_bucket(self, name: str, owner: str, region: str, acl: str = "private") -> None:
        await self._run(self.index.create_bucket, name, owner, region, acl)

    async def set_bucket_tags(self, bucket: str, tags: dict[str, str]) -> None:
        await self._run(self.index.set_bucket_attribute, bucket, "tags", json.dumps(tags))

    async def set_bucket_acl(self, bucket: str, acl: str) -> None:
        await self._run(self.index.set_bucket_attribute, bucket, "acl", acl)

    async def set_bucket_lifecycle(self, bucket: str, rules: tuple[LifecycleRule, ...]) -> None:
        await self._run(self.index.set_bucket_attribute, bucket, "lifecycle", json.dumps(rules_to_json(rules)))

    async def set_object_tags(self, bucket: str, key: str, tags: dict[str, str]) -> None:
        await self._run(self.index.set_object_attribute, bucket, key, "tags", json.dumps(tags))

    async def set_object_acl(self, bucket: str, key: str, acl: str) -> None:
        await self._run(self.index.set_object_attribute, bucket, key, "acl", acl)

    async def get_bucket(self, name: str) -> BucketInfo:
        return await self._run(self.index.get_bucket, name)

    async def delete_bucket(self, name: str) -> None:
        for upload_id in await self._run(self.index.delete_bucket, name):
            self.blobs.remove_upload_dir(upload_id)

    async def list_buckets(self, owner: str, prefix: str = "", after: str = "", limit: int = 10000) -> list[BucketInfo]:
        return await self._run(self.index.list_buckets, owner, prefix, after, limit)

    # -- objects ---------------------------------------------------------------
    async def _precheck(self, bucket: str, key: str, condition: WriteCondition | None) -> None:
        """A condition that already fails is answered before any bytes are received or copied (the commit checks again)."""
        if condition is None:
            await self.get_bucket(bucket)
            return
        current = await self._run(self._current_or_none, bucket, key)
        check_write_condition(condition, current, bucket, key)

    def _current_or_none(self, bucket: str, key: str) -> ObjectMeta | None:
        try:
            return self.index.current(bucket, key)
        except S3Error as e:
            if e.code is ErrorCode.NoSuchKey:
                return None
            raise

    async def put_object(self, bucket: str, key: str, body: BodyStream, spec: PutSpec, owner: str,
                         condition: WriteCondition | None = None) -> ObjectMeta:
        await self._precheck(bucket, key, condition)
        tmp, d = await self.blobs.receive(body, spec, MAX_PUT_SIZE, self._run)
        meta = _meta(bucket, key, d, spec, owner, time.time())

        return await self._run(self._group.commit, bucket, tmp, meta, spec.immutable, condition)

    async def put_many(self, bucket: str, items: list[tuple[str, bytes | memoryview, PutSpec]], owner: str) -> list[ObjectMeta]:
        await self.get_bucket(bucket)
        return await self._run(self._put_many_sync, bucket, items, owner)

    def _put_many_sync(self, bucket: str, items: list[tuple[str, bytes | memoryview, PutSpec]], owner: str) -> list[ObjectMeta]:
        """Verify every item, write them all durably at once, publish them, commit in one transaction.

        Nothing is visible or acknowledged before the commit; the durability barriers are per batch.
        """
        now = time.time()
        metas: list[tuple[ObjectMeta, bool]] = []
        for key, data, spec in items:
            d = Digester(set(spec.checksum_algorithms) | set(spec.expected_checksums))
            d.update(data)
            verify_received(spec, d)
            metas.append((_meta(bucket, key, d, spec, owner, now), spec.immutable))
        tmps = self.blobs.write_batch([data for _, data, _ in items])
        try:
            finals = self.blobs.publish_many(tmps)
        except BaseException:
            for tmp in tmps:
                tmp.unlink(missing_ok=True)
            raise
        return self._commit(bucket, [(final, meta, immutable, None) for final, (meta, immutable) in zip(finals, metas)])

    async def head_object(self, bucket: str, key: str) -> ObjectMeta:
        return await self._run(self.index.current, bucket, key)

    def _open_current(self, bucket: str, key: str, prefetch: int) -> tuple[ObjectMeta, int, bytes]:
        """The key's metadata, an fd of exactly those bytes and its first ``prefetch`` bytes.

        A concurrent overwrite or delete may unlink the file between the lookup and the
        open; then the row is read again, so the pair is always one version.
        """
        for _ in range(16):
            meta = self.index.current(bucket, key)
            try:
                fd = os.open(meta.locator, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                return meta, fd, os.pread(fd, min(prefetch, meta.size), 0) if prefetch else b""
            except BaseException:
                os.close(fd)
                raise
        raise S3Error(ErrorCode.ServiceUnavailable, f"Object {key!r} is being replaced too often to read; retry.", resource=f"/{bucket}/{key}")

    async def open_object(self, bucket: str, key: str, prefetch: int = 0) -> ObjectReader:
        meta, fd, head = await self._run(self._open_current, bucket, key, prefetch)
        return _FileReader(self, meta, fd, head)

    @staticmethod
    def _open_version(meta: ObjectMeta) -> int:
        """An fd of exactly ``meta``'s bytes (a copy source), or 503 if that version was replaced meanwhile."""
        try:
            return os.open(meta.locator, os.O_RDONLY)
        except FileNotFoundError:
            raise S3Error(ErrorCode.ServiceUnavailable, f"Object {meta.key!r} was replaced or deleted while it was being copied; retry.",
                          resource=f"/{meta.bucket}/{meta.key}") from None

    async def delete_object(self, bucket: str, key: str) -> None:
        await self.delete_many(bucket, [key])

    async def delete_many(self, bucket: str, keys: list[str]) -> None:
        def work() -> None:
            for path in self.index.delete(bucket, keys):
                Path(path).unlink(missing_ok=True)

        await self._run(work)

    async def evict_chunks(self, bucket: str, versions: list[tuple[str, str]]) -> int:
        """Delete the chunk versions (key, file) that are still current; how many were (see :meth:`MetadataIndex.evict`)."""
        def work() -> int:
            paths = self.index.evict(bucket, versions)
            for path in paths:
                Path(path).unlink(missing_ok=True)
            return len(paths)

        return await self._run(work)

    async def locate(self, bucket: str, keys: list[str]) -> list[tuple[str, int] | None]:
        """For each key, its file and size (None if absent): what the local chunk source pins."""
        return await self._run(self.index.locate, bucket, keys)

    async def copy_object(self, src: ObjectMeta, bucket: str, key: str, spec: PutSpec, owner: str,
                          condition: WriteCondition | None = None) -> ObjectMeta:
        meta = ObjectMeta(bucket=bucket, key=key, size=src.size, etag=src.etag, last_modified=time.time(), content_type=spec.content_type,
                          user_metadata=spec.user_metadata, system_headers=spec.system_headers, checksums=src.checksums,
                          part_sizes=src.part_sizes, owner=owner, tags=spec.tags, acl=spec.acl)
        if (src.bucket, src.key) == (bucket, key):
            return await self._run(self.index.replace_metadata, meta, condition)  # the same bytes under new metadata
        await self._precheck(bucket, key, condition)

        def copy() -> ObjectMeta:
            fd = self._open_version(src)
            try:
                tmp = self.blobs.concatenate([(fd, 0, src.size)])
            finally:
                os.close(fd)
            return self._commit(bucket, [(self.blobs.publish(tmp), meta, False, condition)])[0]

        return await self._run(copy)

    async def list_objects(self, bucket: str, prefix: str = "", delimiter: str = "", after: str = "", limit: int = 1000) -> ListPage:
        return await self._run(self.index.list_objects, bucket, prefix, delimiter, after, limit)

    # -- multipart -------------------------------------------------------------
    async def create_upload(self, bucket: str, key: str, spec: PutSpec, owner: str) -> UploadInfo:
        info = UploadInfo(uuid.uuid4().hex + uuid.uuid4().hex, bucket, key, time.time(), owner, spec)
        await self._run(self.index.create_upload, info)
        self.blobs.make_upload_dir(info.upload_id)
        return info

    async def get_upload(self, bucket: str, key: str, upload_id: str) -> UploadInfo:
        return await self._run(self.index.get_upload, bucket, key, upload_id)

    @staticmethod
    def _install(final: Path, commit: Callable[[str], str | None]) -> None:
        """Commit the row that points at ``final``; then unlink the file it replaced (or ``final``, if the commit failed)."""
        try:
            old = commit(str(final))
        except BaseException:
            final.unlink(missing_ok=True)
            raise
        if old:
            Path(old).unlink(missing_ok=True)

    def _commit_part(self, upload: UploadInfo, part: PartInfo, tmp: Path, started: int) -> PartInfo:
        final = self.blobs.publish_part(upload.upload_id, part.part_number, tmp)
        self._install(final, lambda path: self.index.commit_part(upload.upload_id, part, path, started))
        return part

    async def upload_part(self, upload: UploadInfo, part_number: int, body: BodyStream, spec: PutSpec) -> PartInfo:
        started = time.time_ns()  # of two uploads of one part number, the one started last counts
        spec = replace(spec, checksum_algorithms=tuple(set(spec.checksum_algorithms) | set(upload.spec.checksum_algorithms)))
        tmp, d = await self.blobs.receive(body, spec, MAX_PUT_SIZE, self._run)
        part = PartInfo(part_number, d.size, f'"{d.md5.hexdigest()}"', time.time(), d.checksum_values())
        return await self._run(self._commit_part, upload, part, tmp, started)

    async def upload_part_copy(self, upload: UploadInfo, part_number: int, src: ObjectMeta, rng: ByteRange | None) -> PartInfo:
        started = time.time_ns()

        def work() -> PartInfo:
            start, end = (rng.start, rng.end) if rng else (0, src.size)
            fd = self._open_version(src)
            try:
                tmp = self.blobs.concatenate([(fd, start, end - start)])
            finally:
                os.close(fd)
            d = Digester(upload.spec.checksum_algorithms)
            with open(tmp, "rb") as f:
                while chunk := f.read(WRITE_BUFFER):
                    d.update(chunk)
            part = PartInfo(part_number, d.size, f'"{d.md5.hexdigest()}"', time.time(), d.checksum_values())
            return self._commit_part(upload, part, tmp, started)

        return await self._run(work)

    async def list_parts(self, upload: UploadInfo, after: int = 0, limit: int = 1000) -> list[PartInfo]:
        return [p for p, _ in await self._run(self.index.parts, upload.upload_id, after, limit)]

    async def complete_upload(self, upload: UploadInfo, parts: list[tuple[int, str, dict[str, str]]],
                              condition: WriteCondition | None = None) -> ObjectMeta:
        stored = {p.part_number: (p, path) for p, path in await self._run(self.index.parts, upload.upload_id)}
        chosen = select_parts(upload, parts, stored, await self._run(self.index.part_attempts, upload.upload_id))
        if condition is not None:
            await self._precheck(upload.bucket, upload.key, condition)
        meta = completed_meta(upload, [p for p, _ in chosen], time.time())

        def work() -> ObjectMeta:
            fds = [os.open(path, os.O_RDONLY) for _, path in chosen]
            try:
                tmp = self.blobs.concatenate([(fd, 0, p.size) for fd, (p, _) in zip(fds, chosen)])
            finally:
                for fd in fds:
                    os.close(fd)
            full = meta
            if upload.spec.checksum_type == "FULL_OBJECT" and upload.spec.checksum_algorithms:
                d = Digester(upload.spec.checksum_algorithms)  # the whole object's checksum: one more pass over its bytes
                with open(tmp, "rb") as f:
                    while chunk := f.read(WRITE_BUFFER):
                        d.update(chunk)
                full = replace(meta, checksums=d.checksum_values())
            final = self.blobs.publish(tmp)
            self._install(final, lambda path: self.index.complete_upload(upload.upload_id, full, path, condition))
            self.blobs.remove_upload_dir(upload.upload_id)
            return replace(full, locator=str(final))

        return await self._run(work)

    async def completed_upload(self, bucket: str, key: str, upload_id: str) -> ObjectMeta | None:
        return await self._run(self.index.completed_upload, bucket, key, upload_id)

    async def abort_upload(self, upload: UploadInfo) -> None:
        await self._run(self.index.abort_upload, upload.upload_id)
        self.blobs.remove_upload_dir(upload.upload_id)

    async def list_uploads(self, bucket: str, prefix: str = "", after_key: str = "", after_upload: str = "", limit: int = 1000) -> list[UploadInfo]:
        return await self._run(self.index.list_uploads, bucket, prefix, after_key, after_upload, limit)

    async def bucket_names(self) -> list[str]:
        return await self._run(self.index.bucket_names)

    async def close(self) -> None:
        self._pool.shutdown(wait=True)


def _meta(bucket: str, key: str, d: Digester, spec: PutSpec, owner: str, now: float) -> ObjectMeta:
    return ObjectMeta(bucket=bucket, key=key, size=d.size, etag=f'"{d.md5.hexdigest()}"', last_modified=now, content_type=spec.content_type,
                      user_metadata=spec.user_metadata, system_headers=spec.system_headers, checksums=d.checksum_values(), owner=owner,
                      tags=spec.tags, acl=spec.acl)


class _FileReader(ObjectReader):
    def __init__(self, store: LocalDiskStore, meta: ObjectMeta, fd: int, head: bytes) -> None:
        self._store, self.meta, self._fd, self.head = store, meta, fd, head

    async def stream(self, rng: ByteRange | None = None, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        start, end = (rng.start, rng.end) if rng else (0, self.meta.size)
        if start < end <= len(self.head):
            yield self.head[start:end]
            return
        pos = start
        while pos < end:
            data = await self._store._run(os.pread, self._fd, min(chunk_size, end - pos), pos)
            if not data:
                raise S3Error(ErrorCode.InternalError, "object file shorter than its metadata")
            pos += len(data)
            yield data

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
