"""The local-disk index's SQLite database: its tables, how older stores are migrated, how rows become records,
and the connection plumbing (one connection per thread, one writer transaction at a time).

The queries live in :mod:`.index`. WAL mode gives one writer at a time and many readers across processes
(the gateway and the storage server open the same database), and ``synchronous=FULL`` makes a commit durable.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from protocol.errors import storage_full

from ..lifecycle import rules_from_json
from ..object_store import BucketInfo, ObjectMeta, PutSpec, UploadInfo

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS buckets (
    name TEXT PRIMARY KEY, owner TEXT NOT NULL, created REAL NOT NULL, region TEXT NOT NULL,
    acl TEXT NOT NULL DEFAULT 'private', tags TEXT NOT NULL DEFAULT '{}', id TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS objects (
    bucket TEXT NOT NULL, key BLOB NOT NULL, size INTEGER NOT NULL, etag TEXT NOT NULL,
    mtime REAL NOT NULL, content_type TEXT NOT NULL, user_meta TEXT NOT NULL,
    sys_headers TEXT NOT NULL, checksums TEXT NOT NULL, part_sizes TEXT NOT NULL,
    path TEXT NOT NULL, owner TEXT NOT NULL, immutable INTEGER NOT NULL DEFAULT 0,
    tags TEXT NOT NULL DEFAULT '{}', acl TEXT NOT NULL DEFAULT 'private',
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
    started INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (upload_id, part_number)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS part_attempts (
    upload_id TEXT NOT NULL, part_number INTEGER NOT NULL, size INTEGER NOT NULL,
    etag TEXT NOT NULL, mtime REAL NOT NULL, checksums TEXT NOT NULL, path TEXT NOT NULL,
    PRIMARY KEY (upload_id, part_number, etag)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS completed_uploads (
    upload_id TEXT PRIMARY KEY, bucket TEXT NOT NULL, key BLOB NOT NULL, etag TEXT NOT NULL, completed REAL NOT NULL
);
"""

SCHEMA_VERSION = 5
MIGRATIONS = (
    ("parts", "started", "INTEGER NOT NULL DEFAULT 0"),  # 2: the latest-started upload of a part number counts
    ("objects", "tags", "TEXT NOT NULL DEFAULT '{}'"),  # 3: tagging and canned ACLs
    ("objects", "acl", "TEXT NOT NULL DEFAULT 'private'"),
    ("buckets", "tags", "TEXT NOT NULL DEFAULT '{}'"),
    ("buckets", "acl", "TEXT NOT NULL DEFAULT 'private'"),
    ("buckets", "id", "TEXT NOT NULL DEFAULT ''"),  # 4: the bucket's incarnation
    ("buckets", "lifecycle", "TEXT NOT NULL DEFAULT '[]'"),  # 5: lifecycle rules (AbortIncompleteMultipartUpload)
)
OBJECT_COLUMNS = "bucket, key, size, etag, mtime, content_type, user_meta, sys_headers, checksums, part_sizes, path, owner, immutable, tags, acl"
BUCKET_COLUMNS = "name, owner, created, region, acl, tags, id, lifecycle"
UPLOAD_COLUMNS = "upload_id, bucket, key, initiated, owner, spec"


def spec_to_json(spec: PutSpec) -> str:
    return json.dumps({"content_type": spec.content_type, "user_metadata": spec.user_metadata, "system_headers": spec.system_headers,
                       "checksum_algorithms": list(spec.checksum_algorithms), "tags": spec.tags, "acl": spec.acl,
                       "checksum_type": spec.checksum_type})


def spec_from_json(s: str) -> PutSpec:
    d = json.loads(s)
    return PutSpec(content_type=d["content_type"], user_metadata=d["user_metadata"], system_headers=d["system_headers"],
                   checksum_algorithms=tuple(d["checksum_algorithms"]), tags=d.get("tags", {}), acl=d.get("acl", "private"),
                   checksum_type=d.get("checksum_type", "COMPOSITE"))


def row_to_meta(r: tuple) -> ObjectMeta:
    return ObjectMeta(bucket=r[0], key=r[1].decode(), size=r[2], etag=r[3], last_modified=r[4], content_type=r[5],
                      user_metadata=json.loads(r[6]), system_headers=json.loads(r[7]), checksums=json.loads(r[8]),
                      part_sizes=tuple(json.loads(r[9])), owner=r[11], locator=r[10], tags=json.loads(r[13]), acl=r[14])


def row_to_bucket(r: tuple) -> BucketInfo:
    # A bucket made before incarnation ids: its creation time stands in (unique to that incarnation in practice).
    return BucketInfo(r[0], r[1], r[2], r[3], r[4], json.loads(r[5]), r[6] or f"created-{r[2]!r}", rules_from_json(json.loads(r[7])))


def row_to_upload(r: tuple) -> UploadInfo:
    return UploadInfo(r[0], r[1], r[2].decode(), r[3], r[4], spec_from_json(r[5]))


class Database:
    """The database at ``db_path``, created or migrated to :data:`SCHEMA_VERSION` when opened."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self._local = threading.local()
        with self._connect() as db:
            db.executescript(SCHEMA)
            for table, column, decl in MIGRATIONS:  # columns later versions added, for stores made before them
                if column not in {r[1] for r in db.execute(f"PRAGMA table_info({table})")}:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.db_path, timeout=30.0, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA busy_timeout=30000")
        return db

    @property
    def db(self) -> sqlite3.Connection:
        """This thread's connection."""
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self._connect()
        return db

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` in one immediate (writer) transaction."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            result = fn(db)
            db.execute("COMMIT")
        except BaseException as e:
            if db.in_transaction:
                db.execute("ROLLBACK")
            full = storage_full(e)  # SQLITE_FULL (or ENOSPC): the disk is full
            if full is not None:
                raise full from None
            raise
        return result
