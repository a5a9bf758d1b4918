"""The local-disk store's metadata index: the queries on buckets, object rows, uploads and parts.

Every statement the store runs is here; the tables, their migrations and the connection plumbing are
in :mod:`.schema`. Keys are stored as BLOBs so SQLite orders them by their UTF-8 bytes, which is S3's
listing order. Methods are blocking; the store calls them on its I/O pool.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import replace
from pathlib import Path

from protocol.errors import ErrorCode, S3Error

from ..object_store import BucketInfo, ListPage, ObjectMeta, PartInfo, UploadInfo, WriteCondition
from ..rules import check_immutable_reput, check_write_condition, common_prefix
from .schema import BUCKET_COLUMNS, OBJECT_COLUMNS, UPLOAD_COLUMNS, Database, row_to_bucket, row_to_meta, row_to_upload, spec_to_json

COMPLETED_KEPT_S = 86400.0
# (path of the published file, its metadata, whether it is an immutable KV chunk, the write's condition if any)
Published = tuple[Path, ObjectMeta, bool, WriteCondition | None]


def key_successor(k: bytes) -> bytes | None:
    """Smallest byte string greater than every string starting with ``k``."""
    k = k.rstrip(b"\xff")
    if not k:
        return None
    return k[:-1] + bytes([k[-1] + 1])


def _no_such_bucket(bucket: str) -> S3Error:
    return S3Error(ErrorCode.NoSuchBucket, resource=f"/{bucket}", extra={"BucketName": bucket})


class MetadataIndex(Database):
    """Every statement the store runs on its database."""

    @staticmethod
    def _bucket_exists(db: sqlite3.Connection, bucket: str) -> None:
        if db.execute("SELECT 1 FROM buckets WHERE name=?", (bucket,)).fetchone() is None:
            raise _no_such_bucket(bucket)

    @staticmethod
    def _insert_object(db: sqlite3.Connection, m: ObjectMeta, path: str, immutable: bool) -> None:
        db.execute(
            f"INSERT OR REPLACE INTO objects ({OBJECT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (m.bucket, m.key.encode(), m.size, m.etag, m.last_modified, m.content_type, json.dumps(m.user_metadata),
             json.dumps(m.system_headers), json.dumps(m.checksums), json.dumps(list(m.part_sizes)), path, m.owner, int(immutable),
             json.dumps(m.tags), m.acl),
        )

    # -- buckets ---------------------------------------------------------------
    def create_bucket(self, name: str, owner: str, region: str, acl: str = "private") -> None:
        def tx(db: sqlite3.Connection) -> None:
            row = db.execute("SELECT owner FROM buckets WHERE name=?", (name,)).fetchone()
            if row is not None:
                code = ErrorCode.BucketAlreadyOwnedByYou if row[0] == owner else ErrorCode.BucketAlreadyExists
                raise S3Error(code, resource=f"/{name}", extra={"BucketName": name})
            db.execute(f"INSERT INTO buckets ({BUCKET_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)",
                       (name, owner, time.time(), region, acl, "{}", uuid.uuid4().hex, "[]"))

        self._write(tx)

    def get_bucket(self, name: str) -> BucketInfo:
        row = self.db.execute(f"SELECT {BUCKET_COLUMNS} FROM buckets WHERE name=?", (name,)).fetchone()
        if row is None:
            raise _no_such_bucket(name)
        return row_to_bucket(row)

    def delete_bucket(self, name: str) -> list[str]:
        """Remove an empty bucket and its abandoned uploads; their ids (their part files go next)."""
        def tx(db: sqlite3.Connection) -> list[str]:
            self._bucket_exists(db, name)
            if db.execute("SELECT 1 FROM objects WHERE bucket=? LIMIT 1", (name,)).fetchone():
                raise S3Error(ErrorCode.BucketNotEmpty, resource=f"/{name}", extra={"BucketName": name})
            uploads = [r[0] for r in db.execute("SELECT upload_id FROM uploads WHERE bucket=?", (name,))]
            for u in uploads:
                db.execute("DELETE FROM parts WHERE upload_id=?", (u,))
                db.execute("DELETE FROM part_attempts WHERE upload_id=?", (u,))
            db.execute("DELETE FROM uploads WHERE bucket=?", (name,))
            db.execute("DELETE FROM buckets WHERE name=?", (name,))
            return uploads

        return self._write(tx)

    def list_buckets(self, owner: str, prefix: str, after: str, limit: int) -> list[BucketInfo]:
        rows = self.db.execute(
            f"SELECT {BUCKET_COLUMNS} FROM buckets WHERE owner=? AND name>? AND substr(name,1,?)=? ORDER BY name LIMIT ?",
            (owner, after, len(prefix), prefix, limit))
        return [row_to_bucket(r) for r in rows]

    def bucket_names(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT name FROM buckets ORDER BY name")]

    def set_bucket_attribute(self, bucket: str, column: str, value: str) -> None:
        """Replace a bucket's tags (JSON), canned ACL or lifecycle rules (JSON)."""
        assert column in ("tags", "acl", "lifecycle")
        if self.db.execute(f"UPDATE buckets SET {column}=? WHERE name=?", (value, bucket)).rowcount == 0:
            raise _no_such_bucket(bucket)

    def set_object_attribute(self, bucket: str, key: str, column: str, value: str) -> None:
        """Replace an object's tags (JSON) or canned ACL, keeping its bytes and the rest of its metadata."""
        assert column in ("tags", "acl")
        if self.db.execute(f"UPDATE objects SET {column}=? WHERE bucket=? AND key=?", (value, bucket, key.encode())).rowcount == 0:
            self.current(bucket, key)  # NoSuchBucket or NoSuchKey

    # -- objects ---------------------------------------------------------------
    def current(self, bucket: str, key: str) -> ObjectMeta:
        """The key's metadata (its ``locator`` is its file), or NoSuchKey (NoSuchBucket if the bucket is gone too)."""
        db = self.db
        row = db.execute(f"SELECT {OBJECT_COLUMNS} FROM objects WHERE bucket=? AND key=?", (bucket, key.encode())).fetchone()
        if row is None:
            self._bucket_exists(db, bucket)
            raise S3Error(ErrorCode.NoSuchKey, resource=f"/{bucket}/{key}", extra={"Key": key})
        return row_to_meta(row)

    def _commit_one(self, db: sqlite3.Connection, bucket: str, published: Published, garbage: list[str]) -> ObjectMeta:
        """One published file's row (or, for an immutable object put again, the existing one; the new file is garbage).
        A conditional write's condition is checked here, in the writer transaction: no other write of the key interleaves."""
        final, meta, immutable, condition = published
        old = db.execute(f"SELECT {OBJECT_COLUMNS} FROM objects WHERE bucket=? AND key=?", (bucket, meta.key.encode())).fetchone()
        check_write_condition(condition, row_to_meta(old) if old is not None else None, bucket, meta.key, committing=True)
        if old is not None and (immutable or old[12]):
            existing = row_to_meta(old)
            check_immutable_reput(existing, meta)
            garbage.append(str(final))
            return existing
        self._insert_object(db, meta, str(final), immutable)
        if old is not None:
            garbage.append(old[10])
        return replace(meta, locator=str(final))

    def commit(self, bucket: str, published: list[Published]) -> tuple[list[ObjectMeta], list[str]]:
        """Make published files visible in one transaction (or none of them): their metadata, and the
        files that became garbage (replaced objects, no-op re-puts of immutable chunks)."""
        def tx(db: sqlite3.Connection) -> tuple[list[ObjectMeta], list[str]]:
            self._bucket_exists(db, bucket)
            garbage: list[str] = []
            return [self._commit_one(db, bucket, p, garbage) for p in published], garbage

        return self._write(tx)

    def commit_group(self, items: list[tuple[str, Published]]) -> tuple[list[ObjectMeta | S3Error], list[str]]:
        """Several single-object commits (a group commit's batch) in one transaction, each in its own
        savepoint: one that fails (no such bucket, an immutable conflict) is that item's error, and the
        others commit. The files that became garbage are returned as with :meth:`commit`."""
        def tx(db: sqlite3.Connection) -> tuple[list[ObjectMeta | S3Error], list[str]]:
            outcomes: list[ObjectMeta | S3Error] = []
            garbage: list[str] = []
            for bucket, published in items:
                db.execute("SAVEPOINT item")
                mine: list[str] = []
                try:
                    self._bucket_exists(db, bucket)
                    outcomes.append(self._commit_one(db, bucket, published, mine))
                except S3Error as e:
                    db.execute("ROLLBACK TO item")
                    outcomes.append(e)
                else:
                    garbage += mine
                db.execute("RELEASE item")
            return outcomes, garbage

        return self._write(tx)

    def replace_metadata(self, meta: ObjectMeta, condition: WriteCondition | None = None) -> ObjectMeta:
        """A copy onto itself: the same bytes under new metadata (an immutable chunk stays immutable)."""
        def tx(db: sqlite3.Connection) -> ObjectMeta:
            row = db.execute(f"SELECT {OBJECT_COLUMNS} FROM objects WHERE bucket=? AND key=?", (meta.bucket, meta.key.encode())).fetchone()
            check_write_condition(condition, row_to_meta(row) if row is not None else None, meta.bucket, meta.key, committing=True)
            if row is None:
                raise S3Error(ErrorCode.NoSuchKey, resource=f"/{meta.bucket}/{meta.key}", extra={"Key": meta.key})
            self._insert_object(db, meta, row[10], bool(row[12]))
            return replace(meta, locator=row[10])

        return self._write(tx)

    def delete(self, bucket: str, keys: list[str]) -> list[str]:
        """Remove rows (missing keys are fine); the files they referenced."""
        def tx(db: sqlite3.Connection) -> list[str]:
            self._bucket_exists(db, bucket)
            paths = []
            for key in keys:
                row = db.execute("DELETE FROM objects WHERE bucket=? AND key=? RETURNING path", (bucket, key.encode())).fetchone()
                if row:
                    paths.append(row[0])
            return paths

        return self._write(tx)

    def evict(self, bucket: str, versions: list[tuple[str, str]]) -> list[str]:
        """Remove each (key, file) row only if it is still that immutable chunk version; the files removed.

        What the chunk bound admitted may have been deleted and replaced since (a plain object, or
        a recreated bucket's object under the same key): those rows have other files and stay.
        """
        def tx(db: sqlite3.Connection) -> list[str]:
            paths = []
            for key, path in versions:
                row = db.execute("DELETE FROM objects WHERE bucket=? AND key=? AND path=? AND immutable=1 RETURNING path",
                                 (bucket, key.encode(), path)).fetchone()
                if row:
                    paths.append(row[0])
            return paths

        return self._write(tx)

    def locate(self, bucket: str, keys: list[str]) -> list[tuple[str, int] | None]:
        """For each key, its file and size (None if absent), in one query per 900 keys."""
        db = self.db
        self._bucket_exists(db, bucket)
        found: dict[bytes, tuple[str, int]] = {}
        encoded = [k.encode() for k in keys]
        for i in range(0, len(encoded), 900):
            batch = encoded[i : i + 900]
            rows = db.execute(f"SELECT key, path, size FROM objects WHERE bucket=? AND key IN ({','.join('?' * len(batch))})", (bucket, *batch))
            for k, path, size in rows:
                found[k] = (path, size)
        return [found.get(k) for k in encoded]

    def chunk_objects(self) -> list[tuple[str, str, str, int, str]]:
        """Every immutable KV chunk as (bucket, key, file, size, owner), oldest written first: what the chunk bound starts from."""
        rows = self.db.execute("SELECT bucket, key, path, size, owner FROM objects WHERE immutable=1 ORDER BY mtime")
        return [(b, k.decode() if isinstance(k, bytes) else k, path, size, owner) for b, k, path, size, owner in rows]

    def referenced_names(self) -> set[str]:
        """The file names object rows point at."""
        return {path.rsplit("/", 1)[-1] for (path,) in self.db.execute("SELECT path FROM objects")}

    def list_objects(self, bucket: str, prefix: str, delimiter: str, after: str, limit: int) -> ListPage:
        """Ordered listing that jumps over each common prefix with one index seek."""
        db = self.db
        self._bucket_exists(db, bucket)
        pb, after_b = prefix.encode(), after.encode()
        upper = key_successor(pb) if pb else None
        pos, inclusive = (after_b, False) if after_b >= pb else (pb, True)
        objects: list[ObjectMeta] = []
        prefixes: list[str] = []
        last: str | None = None
        batch = min(max(limit, 1) + 1, 1000)

        def page(pos: bytes, inclusive: bool, n: int) -> list[tuple]:
            sql = f"SELECT {OBJECT_COLUMNS} FROM objects WHERE bucket=? AND key {'>=' if inclusive else '>'} ?"
            args: list = [bucket, pos]
            if upper is not None:
                sql += " AND key < ?"
                args.append(upper)
            return db.execute(sql + " ORDER BY key LIMIT ?", [*args, n]).fetchall()

        while True:
            rows = page(pos, inclusive, batch)
            if not rows:
                return ListPage(objects, prefixes, False, last)
            jumped = False
            for r in rows:
                k: bytes = r[1]
                cp = common_prefix(k.decode(), prefix, delimiter)
                if cp is not None:
                    if not (after and cp.encode() <= after_b):
                        if len(objects) + len(prefixes) >= limit:
                            return ListPage(objects, prefixes, True, last)
                        prefixes.append(cp)
                        last = cp
                    nxt = key_successor(cp.encode())
                    if nxt is None:
                        return ListPage(objects, prefixes, False, last)
                    pos, inclusive, jumped = nxt, True, True
                    break
                if len(objects) + len(prefixes) >= limit:
                    return ListPage(objects, prefixes, True, last)
                objects.append(row_to_meta(r))
                last = objects[-1].key
                pos, inclusive = k, False
            if not jumped and len(rows) < batch:
                return ListPage(objects, prefixes, False, last)

    # -- multipart -------------------------------------------------------------
    def create_upload(self, info: UploadInfo) -> None:
        def tx(db: sqlite3.Connection) -> None:
            self._bucket_exists(db, info.bucket)
            db.execute(f"INSERT INTO uploads ({UPLOAD_COLUMNS}) VALUES (?,?,?,?,?,?)",
                       (info.upload_id, info.bucket, info.key.encode(), info.initiated, info.owner, spec_to_json(info.spec)))

        self._write(tx)

    def get_upload(self, bucket: str, key: str, upload_id: str) -> UploadInfo:
        row = self.db.execute(f"SELECT {UPLOAD_COLUMNS} FROM uploads WHERE upload_id=? AND bucket=? AND key=?",
                              (upload_id, bucket, key.encode())).fetchone()
        if row is None:
            self._bucket_exists(self.db, bucket)
            raise S3Error(ErrorCode.NoSuchUpload, resource=f"/{bucket}/{key}", extra={"UploadId": upload_id})
        return row_to_upload(row)

    def commit_part(self, upload_id: str, part: PartInfo, path: str, started: int) -> str | None:
        """Record a part. Of attempts at one part number the one started last is listed; the others with
        other bytes stay in ``part_attempts`` until the upload completes or is aborted, since the client may
        complete with any of their ETags (a re-sent part whose first attempt finished last). The file no
        longer needed (one holding the same bytes as a kept attempt), if any."""
        def tx(db: sqlite3.Connection) -> str | None:
            if db.execute("SELECT 1 FROM uploads WHERE upload_id=?", (upload_id,)).fetchone() is None:
                raise S3Error(ErrorCode.NoSuchUpload, extra={"UploadId": upload_id})
            old = db.execute("SELECT size, etag, mtime, checksums, path, started FROM parts WHERE upload_id=? AND part_number=?",
                             (upload_id, part.part_number)).fetchone()
            if old is not None and old[1] == part.etag:  # the same bytes again: one file is enough
                if old[5] > started:
                    return path
                db.execute("UPDATE parts SET started=?, mtime=? WHERE upload_id=? AND part_number=?", (started, part.last_modified, upload_id, part.part_number))
                return None
            if old is not None and old[5] > started:  # a later-started attempt is listed: this one is kept aside
                return self._keep_attempt(db, upload_id, part, path)
            if old is not None:
                db.execute("DELETE FROM part_attempts WHERE upload_id=? AND part_number=? AND etag=?", (upload_id, part.part_number, part.etag))
                self._keep_attempt(db, upload_id, PartInfo(part.part_number, old[0], old[1], old[2], json.loads(old[3])), old[4])
            db.execute("INSERT OR REPLACE INTO parts VALUES (?,?,?,?,?,?,?,?)",
                       (upload_id, part.part_number, part.size, part.etag, part.last_modified, json.dumps(part.checksums), path, started))
            return None

        return self._write(tx)

    @staticmethod
    def _keep_attempt(db: sqlite3.Connection, upload_id: str, part: PartInfo, path: str) -> str | None:
        had = db.execute("SELECT path FROM part_attempts WHERE upload_id=? AND part_number=? AND etag=?",
                         (upload_id, part.part_number, part.etag)).fetchone()
        if had is not None:
            return path  # these bytes are kept already
        db.execute("INSERT INTO part_attempts VALUES (?,?,?,?,?,?,?)",
                   (upload_id, part.part_number, part.size, part.etag, part.last_modified, json.dumps(part.checksums), path))
        return None

    def part_attempts(self, upload_id: str) -> list[tuple[PartInfo, str]]:
        """The attempts at an upload's parts that are not the listed part (see :meth:`commit_part`)."""
        rows = self.db.execute("SELECT part_number, size, etag, mtime, checksums, path FROM part_attempts WHERE upload_id=?", (upload_id,))
        return [(PartInfo(r[0], r[1], r[2], r[3], json.loads(r[4])), r[5]) for r in rows]

    def parts(self, upload_id: str, after: int = 0, limit: int = 10001) -> list[tuple[PartInfo, str]]:
        rows = self.db.execute(
            "SELECT part_number, size, etag, mtime, checksums, path FROM parts WHERE upload_id=? AND part_number>? ORDER BY part_number LIMIT ?",
            (upload_id, after, limit))
        return [(PartInfo(r[0], r[1], r[2], r[3], json.loads(r[4])), r[5]) for r in rows]

    def complete_upload(self, upload_id: str, meta: ObjectMeta, path: str, condition: WriteCondition | None = None) -> str | None:
        """The upload becomes the object at ``path`` if ``condition`` holds; the file of the object it replaced."""
        def tx(db: sqlite3.Connection) -> str | None:
            if db.execute("SELECT 1 FROM uploads WHERE upload_id=?", (upload_id,)).fetchone() is None:
                raise S3Error(ErrorCode.NoSuchUpload, extra={"UploadId": upload_id})
            self._bucket_exists(db, meta.bucket)
            row = db.execute(f"SELECT {OBJECT_COLUMNS} FROM objects WHERE bucket=? AND key=?", (meta.bucket, meta.key.encode())).fetchone()
            check_write_condition(condition, row_to_meta(row) if row is not None else None, meta.bucket, meta.key, committing=True)
            if row is not None and row[12]:
                check_immutable_reput(row_to_meta(row), meta)  # an upload never replaces a KV chunk's bytes
            self._insert_object(db, meta, path, bool(row[12]) if row is not None else False)
            db.execute("DELETE FROM parts WHERE upload_id=?", (upload_id,))
            db.execute("DELETE FROM part_attempts WHERE upload_id=?", (upload_id,))
            db.execute("DELETE FROM uploads WHERE upload_id=?", (upload_id,))
            # Remembered for a day: a client that lost the response retries, and gets the same answer.
            db.execute("DELETE FROM completed_uploads WHERE completed < ?", (time.time() - COMPLETED_KEPT_S,))
            db.execute("INSERT OR REPLACE INTO completed_uploads VALUES (?,?,?,?,?)",
                       (upload_id, meta.bucket, meta.key.encode(), meta.etag, time.time()))
            return row[10] if row is not None else None

        return self._write(tx)

    def completed_upload(self, bucket: str, key: str, upload_id: str) -> ObjectMeta | None:
        """The object a recently completed upload became, while the key still holds exactly it."""
        row = self.db.execute("SELECT etag FROM completed_uploads WHERE upload_id=? AND bucket=? AND key=?",
                              (upload_id, bucket, key.encode())).fetchone()
        if row is None:
            return None
        try:
            current = self.current(bucket, key)
        except S3Error:
            return None
        return current if current.etag == row[0] else None

    def abort_upload(self, upload_id: str) -> None:
        def tx(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM parts WHERE upload_id=?", (upload_id,))
            db.execute("DELETE FROM part_attempts WHERE upload_id=?", (upload_id,))
            db.execute("DELETE FROM uploads WHERE upload_id=?", (upload_id,))

        self._write(tx)

    def list_uploads(self, bucket: str, prefix: str, after_key: str, after_upload: str, limit: int) -> list[UploadInfo]:
        db = self.db
        self._bucket_exists(db, bucket)
        pb, ak = prefix.encode(), after_key.encode()
        rows = db.execute(
            f"SELECT {UPLOAD_COLUMNS} FROM uploads WHERE bucket=? AND substr(key,1,?)=? AND (key>? OR (key=? AND upload_id>?)) "
            "ORDER BY key, upload_id LIMIT ?",
            (bucket, len(pb), pb, ak, ak, after_upload, limit))
        return [row_to_upload(r) for r in rows]
