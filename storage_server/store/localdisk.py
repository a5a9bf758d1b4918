"""Embedded local-disk store: object bytes in files, metadata in SQLite.

Durability protocol for every write (PUT, copy, multipart complete):

1. stream the bytes into ``tmp/<uuid>`` and ``fsync`` it;
2. ``rename`` it to its final, never-reused name ``objects/<xx>/<uuid>``
   and ``fsync`` the directory;
3. commit the metadata row (SQLite WAL, ``synchronous=FULL``);
4. only then acknowledge, and unlink the file the row used to point at.

A crash before 3 leaves at most an unreferenced file, in ``tmp/`` (swept at
start-up) or in ``objects/`` (:meth:`LocalDiskStore.reclaim_orphans`); a crash
after 3 leaves the new object whole. Both sweeps spare files written within
``GRACE_S``: the other process may be writing them right now. Readers never see a
row whose file is incomplete. The gateway and the storage-server daemon open
the same directory: SQLite's WAL gives one writer at a time and many readers
across processes.

Keys are stored as BLOBs so SQLite orders them by their UTF-8 bytes, which is
S3's listing order.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import sqlite3
import stat
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from protocol.checksums import Digester, composite_checksum, verify_digests
from protocol.errors import ErrorCode, S3Error

from .object_store import BodyStream, BucketInfo, ByteRange, ListPage, ObjectMeta, ObjectReader, ObjectStore, PartInfo, PutSpec, UploadInfo

T = TypeVar("T")

MAX_OBJECT_SIZE = 5 * 1024**4
MAX_PUT_SIZE = 5 * 1024**3
MIN_PART_SIZE = 5 * 1024**2
WRITE_BUFFER = 1 << 20
# Files younger than this are never swept: a write in progress touches its file
# continuously and commits within moments of its last byte.
GRACE_S = 3600.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS buckets (
    name TEXT PRIMARY KEY, owner TEXT NOT NULL, created REAL NOT NULL, region TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS objects (
    bucket TEXT NOT NULL, key BLOB NOT NULL, size INTEGER NOT NULL, etag TEXT NOT NULL,
    mtime REAL NOT NULL, content_type TEXT NOT NULL, user_meta TEXT NOT NULL,
    sys_headers TEXT NOT NULL, checksums TEXT NOT NULL, part_sizes TEXT NOT NULL,
    path TEXT NOT NULL, owner TEXT NOT NULL, immutable INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (bucket, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS uploads (
    upload_id TEXT PRIMARY KEY, bucket TEXT NOT NULL, key BLOB NOT NULL,
    initiated REAL NOT NULL, owner TEXT NOT NULL, spec TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS uploads_by_key ON uploads (bucket, key, upload_id);
CREATE TABLE IF NOT EXISTS parts (
    upload_id TEXT NOT NULL, part_number INTEGER NOT NULL, size INTEGER NOT NULL,
    etag TEXT NOT NULL, mtime REAL NOT NULL, checksums TEXT NOT NULL, path TEXT NOT NULL,
    PRIMARY KEY (upload_id, part_number)
) WITHOUT ROWID;
"""

OBJECT_COLUMNS = "bucket, key, size, etag, mtime, content_type, user_meta, sys_headers, checksums, part_sizes, path, owner, immutable"


def key_successor(k: bytes) -> bytes | None:
    """Smallest byte string greater than every string starting with ``k``."""
    k = k.rstrip(b"\xff")
    if not k:
        return None
    return k[:-1] + bytes([k[-1] + 1])


def _spec_to_json(spec: PutSpec) -> str:
    return json.dumps(
        {
            "content_type": spec.content_type,
            "user_metadata": spec.user_metadata,
            "system_headers": spec.system_headers,
            "checksum_algorithms": list(spec.checksum_algorithms),
        }
    )


def _spec_from_json(s: str) -> PutSpec:
    d = json.loads(s)
    return PutSpec(
        content_type=d["content_type"],
        user_metadata=d["user_metadata"],
        system_headers=d["system_headers"],
        checksum_algorithms=tuple(d["checksum_algorithms"]),
    )


class LocalDiskStore(ObjectStore):
    """The embedded default store (see module docstring for the durability rules)."""

    def __init__(self, data_dir: str | os.PathLike, io_threads: int = 16) -> None:
        self.root = Path(data_dir).resolve()
        self.objects_dir = self.root / "objects"
        self.tmp_dir = self.root / "tmp"
        self.parts_dir = self.root / "parts"
        for d in (self.root, self.objects_dir, self.tmp_dir, self.parts_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.db_path = self.root / "meta.sqlite3"
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="localdisk")
        self._sweep_tmp()
        with self._connect() as db:
            db.executescript(SCHEMA)
            db.execute("PRAGMA user_version = 1")

    # -- plumbing ------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.db_path, timeout=30.0, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA busy_timeout=30000")
        return db

    @property
    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self._connect()
        return db

    def _sweep_tmp(self, grace_s: float = GRACE_S) -> None:
        """Remove writes that were never acknowledged (crash leftovers), sparing recent ones.

        The gateway and the storage server both open the store; one starting
        (or restarting) must not delete the other's in-flight upload.
        """
        for p in _older_than(self.tmp_dir.iterdir(), grace_s):
            p.unlink(missing_ok=True)

    async def reclaim_orphans(self, grace_s: float = GRACE_S) -> int:
        return await self._run(self._reclaim_orphans_sync, grace_s)

    def _reclaim_orphans_sync(self, grace_s: float = GRACE_S) -> int:
        """Delete object files no metadata row references (a crash between publish and commit,
        or between a commit and the unlink of the file it replaced). Returns how many.

        Files are listed before the metadata is read, so a file committed meanwhile
        counts as referenced; files are matched by name, never-reused uuids, so a
        moved data directory cannot make live files look unreferenced.
        """
        candidates = list(_older_than((f for d in self.objects_dir.iterdir() if d.is_dir() for f in d.iterdir()), grace_s))
        if not candidates:
            return 0
        referenced = {os.path.basename(path) for (path,) in self._db.execute("SELECT path FROM objects")}
        removed = 0
        for f in candidates:
            if f.name not in referenced:
                f.unlink(missing_ok=True)
                removed += 1
        return removed

    async def _run(self, fn: Callable[..., T], *args) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _write_tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            result = fn(db)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return result

    def _new_tmp(self) -> Path:
        return self.tmp_dir / uuid.uuid4().hex

    def _final_path(self) -> Path:
        name = uuid.uuid4().hex
        d = self.objects_dir / name[:2]
        d.mkdir(exist_ok=True)
        return d / name

    @staticmethod
    def _fsync_dir(d: Path) -> None:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _publish(self, tmp: Path) -> Path:
        """fsync'd tmp file -> durable final name."""
        final = self._final_path()
        os.rename(tmp, final)
        self._fsync_dir(final.parent)
        return final

    def _bucket_exists(self, db: sqlite3.Connection, bucket: str) -> None:
        if db.execute("SELECT 1 FROM buckets WHERE name=?", (bucket,)).fetchone() is None:
            raise S3Error(ErrorCode.NoSuchBucket, resource=f"/{bucket}", extra={"BucketName": bucket})

    @staticmethod
    def _row_to_meta(r: tuple) -> ObjectMeta:
        return ObjectMeta(
            bucket=r[0],
            key=r[1].decode(),
            size=r[2],
            etag=r[3],
            last_modified=r[4],
            content_type=r[5],
            user_metadata=json.loads(r[6]),
            system_headers=json.loads(r[7]),
            checksums=json.loads(r[8]),
            part_sizes=tuple(json.loads(r[9])),
            owner=r[11],
            locator=r[10],
        )

    def _object_path(self, db: sqlite3.Connection, bucket: str, key: str) -> str | None:
        row = db.execute("SELECT path FROM objects WHERE bucket=? AND key=?", (bucket, key.encode())).fetchone()
        return row[0] if row else None

    # -- streaming a body into a durable temp file ---------------------------
    async def _receive(self, body: BodyStream, spec: PutSpec, limit: int) -> tuple[Path, Digester]:
        """Write ``body`` to an fsync'd temp file, verifying size and digests."""
        tmp = self._new_tmp()
        digester = Digester(set(spec.checksum_algorithms) | set(spec.expected_checksums))
        f = await self._run(open, tmp, "wb")
        try:
            buf: list[bytes] = []
            buffered = 0
            async for chunk in body:
                digester.update(chunk)
                if digester.size > limit:
                    raise S3Error(ErrorCode.EntityTooLarge)
                buf.append(chunk)
                buffered += len(chunk)
                if buffered >= WRITE_BUFFER:
                    await self._run(f.writelines, buf)
                    buf, buffered = [], 0
            if buf:
                await self._run(f.writelines, buf)
            self._verify(spec, digester)
            await self._run(_flush_and_close, f)
        except BaseException:
            f.close()
            tmp.unlink(missing_ok=True)
            raise
        return tmp, digester

    @staticmethod
    def _verify(spec: PutSpec, d: Digester) -> None:
        if spec.expected_size is not None and d.size != spec.expected_size:
            raise S3Error(ErrorCode.IncompleteBody)
        expected_checksums = dict(spec.expected_checksums)
        if spec.late_checksums is not None:
            expected_checksums.update(spec.late_checksums())
        verify_digests(d, spec.expected_md5, expected_checksums)

    # -- buckets ---------------------------------------------------------------
    async def create_bucket(self, name: str, owner: str, region: str) -> None:
        def tx(db: sqlite3.Connection) -> None:
            row = db.execute("SELECT owner FROM buckets WHERE name=?", (name,)).fetchone()
            if row is not None:
                code = ErrorCode.BucketAlreadyOwnedByYou if row[0] == owner else ErrorCode.BucketAlreadyExists
                raise S3Error(code, resource=f"/{name}", extra={"BucketName": name})
            db.execute("INSERT INTO buckets VALUES (?,?,?,?)", (name, owner, time.time(), region))

        await self._run(self._write_tx, tx)

    async def get_bucket(self, name: str) -> BucketInfo:
        def q() -> BucketInfo:
            row = self._db.execute("SELECT name, owner, created, region FROM buckets WHERE name=?", (name,)).fetchone()
            if row is None:
                raise S3Error(ErrorCode.NoSuchBucket, resource=f"/{name}", extra={"BucketName": name})
            return BucketInfo(*row)

        return await self._run(q)

    async def delete_bucket(self, name: str) -> None:
        def tx(db: sqlite3.Connection) -> list[str]:
            self._bucket_exists(db, name)
            if db.execute("SELECT 1 FROM objects WHERE bucket=? LIMIT 1", (name,)).fetchone():
                raise S3Error(ErrorCode.BucketNotEmpty, resource=f"/{name}", extra={"BucketName": name})
            uploads = [r[0] for r in db.execute("SELECT upload_id FROM uploads WHERE bucket=?", (name,))]
            for u in uploads:
                db.execute("DELETE FROM parts WHERE upload_id=?", (u,))
            db.execute("DELETE FROM uploads WHERE bucket=?", (name,))
            db.execute("DELETE FROM buckets WHERE name=?", (name,))
            return uploads

        for u in await self._run(self._write_tx, tx):
            shutil.rmtree(self.parts_dir / u, ignore_errors=True)

    async def list_buckets(self, owner: str, prefix: str = "", after: str = "", limit: int = 10000) -> list[BucketInfo]:
        def q() -> list[BucketInfo]:
            rows = self._db.execute(
                "SELECT name, owner, created, region FROM buckets WHERE owner=? AND name>? AND substr(name,1,?)=? "
                "ORDER BY name LIMIT ?",
                (owner, after, len(prefix), prefix, limit),
            )
            return [BucketInfo(*r) for r in rows]

        return await self._run(q)

    # -- objects ---------------------------------------------------------------
    async def put_object(self, bucket: str, key: str, body: BodyStream, spec: PutSpec, owner: str) -> ObjectMeta:
        await self.get_bucket(bucket)
        tmp, d = await self._receive(body, spec, MAX_PUT_SIZE)
        meta = ObjectMeta(
            bucket=bucket,
            key=key,
            size=d.size,
            etag=f'"{d.md5.hexdigest()}"',
            last_modified=time.time(),
            content_type=spec.content_type,
            user_metadata=spec.user_metadata,
            system_headers=spec.system_headers,
            checksums=d.checksum_values(),
            owner=owner,
        )
        return await self._run(self._commit_new_file, tmp, meta, spec.immutable)

    async def put_many(self, bucket: str, items: list[tuple[str, bytes, PutSpec]], owner: str) -> list[ObjectMeta]:
        await self.get_bucket(bucket)
        return await self._run(self._put_many_sync, bucket, items, owner)

    def _put_many_sync(self, bucket: str, items: list[tuple[str, bytes, PutSpec]], owner: str) -> list[ObjectMeta]:
        """Write every file, one durability barrier, publish, one transaction.

        ``os.sync`` once per batch costs far less than an ``fsync`` per small
        file; nothing is visible or acknowledged before the commit.
        """
        now = time.time()
        staged: list[tuple[Path, ObjectMeta, bool]] = []
        try:
            for key, data, spec in items:
                d = Digester(set(spec.checksum_algorithms) | set(spec.expected_checksums))
                d.update(data)
                self._verify(spec, d)
                tmp = self._new_tmp()
                with open(tmp, "wb") as f:
                    f.write(data)
                meta = ObjectMeta(
                    bucket=bucket, key=key, size=d.size, etag=f'"{d.md5.hexdigest()}"', last_modified=now,
                    content_type=spec.content_type, user_metadata=spec.user_metadata,
                    system_headers=spec.system_headers, checksums=d.checksum_values(), owner=owner,
                )
                staged.append((tmp, meta, spec.immutable))
            os.sync()
            published = [(self._final_path_no_sync(tmp), meta, imm) for tmp, meta, imm in staged]
            staged = []
            os.sync()
        except BaseException:
            for tmp, _, _ in staged:
                tmp.unlink(missing_ok=True)
            raise

        return self._commit_published(bucket, published)

    def _final_path_no_sync(self, tmp: Path) -> Path:
        final = self._final_path()
        os.rename(tmp, final)
        return final

    def _commit_new_file(self, tmp: Path, meta: ObjectMeta, immutable: bool = False) -> ObjectMeta:
        return self._commit_published(meta.bucket, [(self._publish(tmp), meta, immutable)])[0]

    def _commit_published(self, bucket: str, published: list[tuple[Path, ObjectMeta, bool]]) -> list[ObjectMeta]:
        """Make durable, published files visible in one transaction (or none of them).

        An immutable object (a KV chunk) may be put again only with identical
        bytes, which is a no-op; different bytes are refused. Replaced files
        and no-op duplicates are unlinked after the commit.
        """

        def tx(db: sqlite3.Connection) -> tuple[list[ObjectMeta], list[str]]:
            self._bucket_exists(db, bucket)
            results, garbage = [], []
            for final, meta, immutable in published:
                old = db.execute(f"SELECT {OBJECT_COLUMNS} FROM objects WHERE bucket=? AND key=?", (bucket, meta.key.encode())).fetchone()
                if old is not None and (immutable or old[12]):
                    existing = self._row_to_meta(old)
                    if (existing.etag, existing.size) != (meta.etag, meta.size):
                        raise S3Error(
                            ErrorCode.InvalidRequest,
                            f"Object {meta.key!r} is an immutable KV chunk and already exists with different bytes.",
                            resource=f"/{bucket}/{meta.key}", extra={"Key": meta.key},
                        )
                    garbage.append(str(final))
                    results.append(existing)
                    continue
                if old is not None:
                    garbage.append(old[10])
                self._insert_object(db, meta, str(final), immutable)
                results.append(replace(meta, locator=str(final)))
            return results, garbage

        try:
            results, garbage = self._write_tx(tx)
        except BaseException:
            for final, _, _ in published:
                final.unlink(missing_ok=True)
            raise
        for g in garbage:
            Path(g).unlink(missing_ok=True)
        return results

    @staticmethod
    def _insert_object(db: sqlite3.Connection, m: ObjectMeta, path: str, immutable: bool) -> None:
        db.execute(
            f"INSERT OR REPLACE INTO objects ({OBJECT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                m.bucket,
                m.key.encode(),
                m.size,
                m.etag,
                m.last_modified,
                m.content_type,
                json.dumps(m.user_metadata),
                json.dumps(m.system_headers),
                json.dumps(m.checksums),
                json.dumps(list(m.part_sizes)),
                path,
                m.owner,
                int(immutable),
            ),
        )

    def _current_row(self, bucket: str, key: str) -> tuple:
        """The key's metadata row, or NoSuchKey (NoSuchBucket if the bucket is gone too)."""
        db = self._db
        row = db.execute(f"SELECT {OBJECT_COLUMNS} FROM objects WHERE bucket=? AND key=?", (bucket, key.encode())).fetchone()
        if row is None:
            self._bucket_exists(db, bucket)
            raise S3Error(ErrorCode.NoSuchKey, resource=f"/{bucket}/{key}", extra={"Key": key})
        return row

    def head_object_sync(self, bucket: str, key: str) -> ObjectMeta:
        return self._row_to_meta(self._current_row(bucket, key))

    async def head_object(self, bucket: str, key: str) -> ObjectMeta:
        return await self._run(self.head_object_sync, bucket, key)

    def _open_current(self, bucket: str, key: str, prefetch: int) -> tuple[ObjectMeta, int, bytes]:
        """The key's metadata, an fd of exactly those bytes and its first ``prefetch`` bytes.

        A concurrent overwrite or delete may unlink the file between the SELECT
        and the open; then the row is read again, so the pair is always one version.
        """
        for _ in range(16):
            row = self._current_row(bucket, key)
            try:
                fd = os.open(row[10], os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                return self._row_to_meta(row), fd, os.pread(fd, min(prefetch, row[2]), 0) if prefetch else b""
            except BaseException:
                os.close(fd)
                raise
        raise S3Error(ErrorCode.ServiceUnavailable, f"Object {key!r} is being replaced too often to read; retry.", resource=f"/{bucket}/{key}")

    async def open_object(self, bucket: str, key: str, prefetch: int = 0) -> ObjectReader:
        meta, fd, head = await self._run(self._open_current, bucket, key, prefetch)
        return _FileReader(self, meta, fd, head)

    def _open_version(self, meta: ObjectMeta) -> int:
        """An fd of exactly ``meta``'s bytes (a copy source), or 503 if that version was replaced meanwhile."""
        try:
            return os.open(meta.locator, os.O_RDONLY)
        except FileNotFoundError:
            raise S3Error(ErrorCode.ServiceUnavailable, f"Object {meta.key!r} was replaced or deleted while it was being copied; retry.",
                          resource=f"/{meta.bucket}/{meta.key}") from None

    async def delete_object(self, bucket: str, key: str) -> None:
        def tx(db: sqlite3.Connection) -> str | None:
            self._bucket_exists(db, bucket)
            path = self._object_path(db, bucket, key)
            db.execute("DELETE FROM objects WHERE bucket=? AND key=?", (bucket, key.encode()))
            return path

        path = await self._run(self._write_tx, tx)
        if path:
            Path(path).unlink(missing_ok=True)

    async def delete_many(self, bucket: str, keys: list[str]) -> None:
        def tx(db: sqlite3.Connection) -> list[str]:
            self._bucket_exists(db, bucket)
            paths = []
            for key in keys:
                row = db.execute("DELETE FROM objects WHERE bucket=? AND key=? RETURNING path", (bucket, key.encode())).fetchone()
                if row:
                    paths.append(row[0])
            return paths

        def work() -> None:
            for path in self._write_tx(tx):
                Path(path).unlink(missing_ok=True)

        await self._run(work)

    async def locate(self, bucket: str, keys: list[str]) -> list[tuple[str, int] | None]:
        return await self._run(self._locate_sync, bucket, keys)

    def _locate_sync(self, bucket: str, keys: list[str]) -> list[tuple[str, int] | None]:
        db = self._db
        self._bucket_exists(db, bucket)
        found: dict[bytes, tuple[str, int]] = {}
        encoded = [k.encode() for k in keys]
        for i in range(0, len(encoded), 900):
            batch = encoded[i : i + 900]
            rows = db.execute(
                f"SELECT key, path, size FROM objects WHERE bucket=? AND key IN ({','.join('?' * len(batch))})", (bucket, *batch)
            )
            for k, path, size in rows:
                found[k] = (path, size)
        return [found.get(k) for k in encoded]

    async def copy_object(self, src: ObjectMeta, bucket: str, key: str, spec: PutSpec, owner: str) -> ObjectMeta:
        meta = ObjectMeta(
            bucket=bucket,
            key=key,
            size=src.size,
            etag=src.etag,
            last_modified=time.time(),
            content_type=spec.content_type,
            user_metadata=spec.user_metadata,
            system_headers=spec.system_headers,
            checksums=src.checksums,
            part_sizes=src.part_sizes,
            owner=owner,
        )
        if (src.bucket, src.key) == (bucket, key):
            # Metadata-only replace: same bytes, new row.
            def tx(db: sqlite3.Connection) -> ObjectMeta:
                path = self._object_path(db, bucket, key)
                if path is None:
                    raise S3Error(ErrorCode.NoSuchKey, resource=f"/{bucket}/{key}", extra={"Key": key})
                self._insert_object(db, meta, path, False)
                return meta

            return await self._run(self._write_tx, tx)
        await self.get_bucket(bucket)
        tmp = await self._run(self._copy_to_tmp, [(src, None)])
        return await self._run(self._commit_new_file, tmp, meta)

    def _copy_to_tmp(self, sources: list[tuple[ObjectMeta | Path, ByteRange | None]]) -> Path:
        """Concatenate (ranges of) objects or part files into one fsync'd temp file."""
        tmp = self._new_tmp()
        try:
            with open(tmp, "wb") as out:
                for src, rng in sources:
                    fd = os.open(src, os.O_RDONLY) if isinstance(src, Path) else self._open_version(src)
                    try:
                        size = os.fstat(fd).st_size
                        start, end = (rng.start, rng.end) if rng else (0, size)
                        _copy_range(fd, out.fileno(), start, end - start)
                    finally:
                        os.close(fd)
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    async def list_objects(self, bucket: str, prefix: str = "", delimiter: str = "", after: str = "", limit: int = 1000) -> ListPage:
        return await self._run(self._list_sync, bucket, prefix, delimiter, after, limit)

    def _list_sync(self, bucket: str, prefix: str, delimiter: str, after: str, limit: int) -> ListPage:
        """Ordered listing that jumps over each common prefix with one index seek."""
        db = self._db
        self._bucket_exists(db, bucket)
        pb, db_delim, after_b = prefix.encode(), delimiter.encode(), after.encode()
        upper = key_successor(pb) if pb else None
        # Position: (key, inclusive)
        pos, inclusive = (after_b, False) if after_b >= pb else (pb, True)
        objects: list[ObjectMeta] = []
        prefixes: list[str] = []
        last: str | None = None
        batch = min(max(limit, 1) + 1, 1000)

        def page(pos: bytes, inclusive: bool, n: int) -> list[tuple]:
            op = ">=" if inclusive else ">"
            sql = f"SELECT {OBJECT_COLUMNS} FROM objects WHERE bucket=? AND key {op} ?"
            args: list = [bucket, pos]
            if upper is not None:
                sql += " AND key < ?"
                args.append(upper)
            sql += " ORDER BY key LIMIT ?"
            args.append(n)
            return db.execute(sql, args).fetchall()

        while True:
            rows = page(pos, inclusive, batch)
            if not rows:
                return ListPage(objects, prefixes, False, last)
            jumped = False
            for r in rows:
                k: bytes = r[1]
                if db_delim:
                    i = k.find(db_delim, len(pb))
                    if i >= 0:
                        cp = k[: i + len(db_delim)]
                        nxt = key_successor(cp)
                        if not (after_b and cp <= after_b):
                            if len(objects) + len(prefixes) >= limit:
                                return ListPage(objects, prefixes, True, last)
                            prefixes.append(cp.decode())
                            last = cp.decode()
                        if nxt is None:
                            return ListPage(objects, prefixes, False, last)
                        pos, inclusive, jumped = nxt, True, True
                        break
                if len(objects) + len(prefixes) >= limit:
                    return ListPage(objects, prefixes, True, last)
                objects.append(self._row_to_meta(r))
                last = objects[-1].key
                pos, inclusive = k, False
            if not jumped and len(rows) < batch:
                return ListPage(objects, prefixes, False, last)

    # -- multipart -------------------------------------------------------------
    async def create_upload(self, bucket: str, key: str, spec: PutSpec, owner: str) -> UploadInfo:
        info = UploadInfo(uuid.uuid4().hex + uuid.uuid4().hex, bucket, key, time.time(), owner, spec)

        def tx(db: sqlite3.Connection) -> None:
            self._bucket_exists(db, bucket)
            db.execute(
                "INSERT INTO uploads VALUES (?,?,?,?,?,?)",
                (info.upload_id, bucket, key.encode(), info.initiated, owner, _spec_to_json(spec)),
            )

        await self._run(self._write_tx, tx)
        (self.parts_dir / info.upload_id).mkdir(exist_ok=True)
        return info

    async def get_upload(self, bucket: str, key: str, upload_id: str) -> UploadInfo:
        def q() -> UploadInfo:
            row = self._db.execute(
                "SELECT upload_id, bucket, key, initiated, owner, spec FROM uploads WHERE upload_id=? AND bucket=? AND key=?",
                (upload_id, bucket, key.encode()),
            ).fetchone()
            if row is None:
                self._bucket_exists(self._db, bucket)
                raise S3Error(ErrorCode.NoSuchUpload, resource=f"/{bucket}/{key}", extra={"UploadId": upload_id})
            return UploadInfo(row[0], row[1], row[2].decode(), row[3], row[4], _spec_from_json(row[5]))

        return await self._run(q)

    def _commit_part(self, upload: UploadInfo, part_number: int, tmp: Path, size: int, etag: str, checksums: dict[str, str]) -> PartInfo:
        final = self.parts_dir / upload.upload_id / f"{part_number:05d}-{uuid.uuid4().hex}"
        final.parent.mkdir(exist_ok=True)
        os.rename(tmp, final)
        self._fsync_dir(final.parent)
        part = PartInfo(part_number, size, etag, time.time(), checksums)

        def tx(db: sqlite3.Connection) -> str | None:
            if db.execute("SELECT 1 FROM uploads WHERE upload_id=?", (upload.upload_id,)).fetchone() is None:
                raise S3Error(ErrorCode.NoSuchUpload, extra={"UploadId": upload.upload_id})
            old = db.execute(
                "SELECT path FROM parts WHERE upload_id=? AND part_number=?", (upload.upload_id, part_number)
            ).fetchone()
            db.execute(
                "INSERT OR REPLACE INTO parts VALUES (?,?,?,?,?,?,?)",
                (upload.upload_id, part_number, size, etag, part.last_modified, json.dumps(checksums), str(final)),
            )
            return old[0] if old else None

        try:
            old = self._write_tx(tx)
        except BaseException:
            final.unlink(missing_ok=True)
            raise
        if old:
            Path(old).unlink(missing_ok=True)
        return part

    async def upload_part(self, upload: UploadInfo, part_number: int, body: BodyStream, spec: PutSpec) -> PartInfo:
        algs = tuple(set(spec.checksum_algorithms) | set(upload.spec.checksum_algorithms))
        spec = replace(spec, checksum_algorithms=algs)
        tmp, d = await self._receive(body, spec, MAX_PUT_SIZE)
        return await self._run(
            self._commit_part, upload, part_number, tmp, d.size, f'"{d.md5.hexdigest()}"', d.checksum_values()
        )

    async def upload_part_copy(self, upload: UploadInfo, part_number: int, src: ObjectMeta, rng: ByteRange | None) -> PartInfo:
        def work() -> PartInfo:
            tmp = self._copy_to_tmp([(src, rng)])
            d = Digester(upload.spec.checksum_algorithms)
            with open(tmp, "rb") as f:
                while chunk := f.read(WRITE_BUFFER):
                    d.update(chunk)
            return self._commit_part(upload, part_number, tmp, d.size, f'"{d.md5.hexdigest()}"', d.checksum_values())

        return await self._run(work)

    def _parts_sync(self, upload_id: str, after: int = 0, limit: int = 10001) -> list[tuple[PartInfo, str]]:
        rows = self._db.execute(
            "SELECT part_number, size, etag, mtime, checksums, path FROM parts WHERE upload_id=? AND part_number>? "
            "ORDER BY part_number LIMIT ?",
            (upload_id, after, limit),
        )
        return [(PartInfo(r[0], r[1], r[2], r[3], json.loads(r[4])), r[5]) for r in rows]

    async def list_parts(self, upload: UploadInfo, after: int = 0, limit: int = 1000) -> list[PartInfo]:
        return [p for p, _ in await self._run(self._parts_sync, upload.upload_id, after, limit)]

    async def complete_upload(self, upload: UploadInfo, parts: list[tuple[int, str, dict[str, str]]]) -> ObjectMeta:
        """``parts``: (part number, ETag, checksums the client claims) in request order."""
        stored = {p.part_number: (p, path) for p, path in await self._run(self._parts_sync, upload.upload_id)}
        if not parts:
            raise S3Error(ErrorCode.MalformedXML, "You must specify at least one part.")
        chosen: list[tuple[PartInfo, str]] = []
        prev = 0
        for number, etag, claimed in parts:
            if number <= prev:
                raise S3Error(ErrorCode.InvalidPartOrder, extra={"UploadId": upload.upload_id})
            prev = number
            hit = stored.get(number)
            if hit is None or hit[0].etag.strip('"') != etag.strip('"'):
                raise S3Error(ErrorCode.InvalidPart, extra={"UploadId": upload.upload_id, "PartNumber": str(number), "ETag": etag})
            for alg, value in claimed.items():
                if hit[0].checksums.get(alg) not in (None, value):
                    raise S3Error(ErrorCode.InvalidPart, f"The {alg} checksum of part {number} does not match.")
            chosen.append(hit)
        for p, _ in chosen[:-1]:
            if p.size < MIN_PART_SIZE:
                raise S3Error(
                    ErrorCode.EntityTooSmall,
                    extra={"ProposedSize": str(p.size), "MinSizeAllowed": str(MIN_PART_SIZE), "PartNumber": str(p.part_number)},
                )
        md5s = b"".join(bytes.fromhex(p.etag.strip('"')) for p, _ in chosen)
        checksums = {}
        for alg in upload.spec.checksum_algorithms:
            values = [p.checksums.get(alg) for p, _ in chosen]
            if all(values):
                checksums[alg] = composite_checksum(alg, values)  # type: ignore[arg-type]
        meta = ObjectMeta(
            bucket=upload.bucket,
            key=upload.key,
            size=sum(p.size for p, _ in chosen),
            etag=f'"{hashlib.md5(md5s).hexdigest()}-{len(chosen)}"',
            last_modified=time.time(),
            content_type=upload.spec.content_type,
            user_metadata=upload.spec.user_metadata,
            system_headers=upload.spec.system_headers,
            checksums=checksums,
            part_sizes=tuple(p.size for p, _ in chosen),
            owner=upload.owner,
        )

        def work() -> ObjectMeta:
            tmp = self._copy_to_tmp([(Path(path), None) for _, path in chosen])
            final = self._publish(tmp)

            def tx(db: sqlite3.Connection) -> str | None:
                if db.execute("SELECT 1 FROM uploads WHERE upload_id=?", (upload.upload_id,)).fetchone() is None:
                    raise S3Error(ErrorCode.NoSuchUpload, extra={"UploadId": upload.upload_id})
                self._bucket_exists(db, meta.bucket)
                old = self._object_path(db, meta.bucket, meta.key)
                self._insert_object(db, meta, str(final), False)
                db.execute("DELETE FROM parts WHERE upload_id=?", (upload.upload_id,))
                db.execute("DELETE FROM uploads WHERE upload_id=?", (upload.upload_id,))
                return old

            try:
                old = self._write_tx(tx)
            except BaseException:
                final.unlink(missing_ok=True)
                raise
            if old:
                Path(old).unlink(missing_ok=True)
            shutil.rmtree(self.parts_dir / upload.upload_id, ignore_errors=True)
            return meta

        return await self._run(work)

    async def abort_upload(self, upload: UploadInfo) -> None:
        def tx(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM parts WHERE upload_id=?", (upload.upload_id,))
            db.execute("DELETE FROM uploads WHERE upload_id=?", (upload.upload_id,))

        await self._run(self._write_tx, tx)
        shutil.rmtree(self.parts_dir / upload.upload_id, ignore_errors=True)

    async def list_uploads(self, bucket: str, prefix: str = "", after_key: str = "", after_upload: str = "", limit: int = 1000) -> list[UploadInfo]:
        def q() -> list[UploadInfo]:
            db = self._db
            self._bucket_exists(db, bucket)
            pb, ak = prefix.encode(), after_key.encode()
            rows = db.execute(
                "SELECT upload_id, bucket, key, initiated, owner, spec FROM uploads "
                "WHERE bucket=? AND substr(key,1,?)=? AND (key>? OR (key=? AND upload_id>?)) "
                "ORDER BY key, upload_id LIMIT ?",
                (bucket, len(pb), pb, ak, ak, after_upload, limit),
            )
            return [UploadInfo(r[0], r[1], r[2].decode(), r[3], r[4], _spec_from_json(r[5])) for r in rows]

        return await self._run(q)

    async def close(self) -> None:
        self._pool.shutdown(wait=True)


def _flush_and_close(f) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()


def _copy_range(src_fd: int, dst_fd: int, offset: int, count: int) -> None:
    """Kernel-side copy where possible (copy_file_range), plain reads otherwise."""
    while count > 0:
        try:
            n = os.copy_file_range(src_fd, dst_fd, min(count, 1 << 30), offset)
        except OSError:
            n = 0
        if n == 0:
            data = os.pread(src_fd, min(count, WRITE_BUFFER), offset)
            if not data:
                raise S3Error(ErrorCode.InternalError, "source object shorter than its metadata")
            n = os.write(dst_fd, data)
        offset += n
        count -= n


class _FileReader(ObjectReader):
    def __init__(self, backend: LocalDiskStore, meta: ObjectMeta, fd: int, head: bytes) -> None:
        self._backend, self.meta, self._fd, self.head = backend, meta, fd, head

    async def stream(self, rng: ByteRange | None = None, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        start, end = (rng.start, rng.end) if rng else (0, self.meta.size)
        if start < end <= len(self.head):
            yield self.head[start:end]
            return
        pos = start
        while pos < end:
            data = await self._backend._run(os.pread, self._fd, min(chunk_size, end - pos), pos)
            if not data:
                raise S3Error(ErrorCode.InternalError, "object file shorter than its metadata")
            pos += len(data)
            yield data

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _older_than(paths, grace_s: float):
    """The regular files among ``paths`` last modified more than ``grace_s`` seconds ago."""
    cutoff = time.time() - grace_s
    for p in paths:
        try:
            st = p.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_mtime < cutoff:
            yield p
