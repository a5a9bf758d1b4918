"""Group commit: concurrent PUTs share the directory fsync and the index commit.

Each acknowledged PUT needs its bytes durable (the temp file's ``fsync``, done by
the PUT itself, in parallel), its final name durable (``rename`` + ``fsync`` of
the directory) and its row durable (a SQLite commit, ``synchronous=FULL``).
Serialised, 16 concurrent 4 KiB PUTs paid 16 directory fsyncs and 16 WAL fsyncs
one after another. Here the PUTs that arrive while a batch is being committed
queue up; the next batch renames all of them into one directory, fsyncs it once
and commits all rows in one transaction (a savepoint each, so one PUT's error is
its own). Every PUT is acknowledged only after the barriers covering it returned:
durability is exactly what it was, fewer barriers are paid for it.

Leader/follower, in the store's I/O threads: the first caller with nothing in
flight commits a batch; callers arriving meanwhile wait, and when a batch ends
the leader hands the next batch to the first of them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from protocol.errors import S3Error

from ..object_store import ObjectMeta, WriteCondition
from .blobs import BlobFiles
from .index import MetadataIndex


@dataclass
class _Pending:
    bucket: str
    tmp: Path
    meta: ObjectMeta
    immutable: bool
    condition: WriteCondition | None = None
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # set (before done) when this caller is to commit the next batch
    result: ObjectMeta | None = None
    error: BaseException | None = None


class GroupCommit:
    def __init__(self, blobs: BlobFiles, index: MetadataIndex) -> None:
        self.blobs = blobs
        self.index = index
        self._lock = threading.Lock()
        self._queue: list[_Pending] = []
        self._busy = False
        self.batches = 0  # how many batches ran (status, and tests that show sharing happened)
        self.committed = 0

    def queued(self) -> int:
        """Commits waiting for the batch in flight to end (status)."""
        with self._lock:
            return len(self._queue)

    def commit(self, bucket: str, tmp: Path, meta: ObjectMeta, immutable: bool, condition: WriteCondition | None = None) -> ObjectMeta:
        """Publish ``tmp`` (an fsync'd temp file) as ``meta`` and commit its row if ``condition`` holds then; durable on return."""
        me = _Pending(bucket, tmp, meta, immutable, condition)
        with self._lock:
            self._queue.append(me)
            me.lead = not self._busy
            self._busy = True
        if not me.lead:
            me.done.wait()
        if me.lead:  # first in, or handed the next batch by the previous leader
            self._lead()
        if me.error is not None:
            raise me.error
        assert me.result is not None
        return me.result

    def _lead(self) -> None:
        with self._lock:
            batch, self._queue = self._queue, []
        garbage: list[str] = []
        try:
            garbage = self._commit_batch(batch)
        finally:
            with self._lock:
                nxt = self._queue[0] if self._queue else None
                self._busy = nxt is not None
            for p in batch:
                p.done.set()
            if nxt is not None:
                nxt.lead = True
                nxt.done.set()
        # Files of the versions this batch replaced, unreferenced since its commit: deleted once the next
        # batch is under way (each unlink is a journaled metadata update, a third of a batch's time when overwriting).
        for g in garbage:
            Path(g).unlink(missing_ok=True)

    def _commit_batch(self, batch: list[_Pending]) -> list[str]:
        """Publish and commit ``batch``; the files of the versions it replaced (to delete)."""
        try:
            finals = self.blobs.publish_group([p.tmp for p in batch])
        except BaseException as e:
            for p in batch:
                p.tmp.unlink(missing_ok=True)
                p.error = e
            return []
        try:
            outcomes, garbage = self.index.commit_group([(p.bucket, (final, p.meta, p.immutable, p.condition)) for p, final in zip(batch, finals)])
        except BaseException as e:  # the transaction as a whole failed (disk full at COMMIT): nobody is acknowledged
            for p, final in zip(batch, finals):
                final.unlink(missing_ok=True)
                p.error = e
            return []
        for p, final, outcome in zip(batch, finals, outcomes):
            if isinstance(outcome, S3Error):
                final.unlink(missing_ok=True)
                p.error = outcome
            else:
                p.result = outcome
        self.batches += 1
        self.committed += len(batch)
        return garbage

