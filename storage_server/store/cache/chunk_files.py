"""A directory of cached chunk files that never holds more than ``max_bytes`` of chunk data.

Each chunk is one file ``<xx>/<id>.<size>.<version>``: ``id`` names (bucket incarnation, key),
``size`` lets a restarted cache rebuild its index from a directory listing alone
(a file whose length differs from its name is a torn write and is removed) without
refetching anything, and ``version`` is the upstream ETag of those bytes (letters, digits
and ``-``), so the copy can be checked against the upstream's current object after a
restart too (a file without one is an unknown version). Files are written under ``tmp/`` and renamed, so a name always
holds whole bytes; the upstream holds the durable copy, so nothing is fsync'd.

Space is *reserved* before a file is written; a reservation evicts unpinned entries
in the order ``cache.policy`` says (:mod:`.policy`) until used + reserved + new <= ``max_bytes``, or fails.
Pinned entries are never chosen; a chunk a transfer holds stays readable even if it is
invalidated, because the transfer reads it through an open descriptor. Accounting is
single-threaded (the event loop); only file writes run in threads.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from .deferred_touches import DeferredTouches
from .policy import make_policy
from .tenants import TenantLedger, TenantQuotas


def chunk_id(bucket_id: str, key: str) -> str:
    return hashlib.sha256(f"{bucket_id}\0{key}".encode()).hexdigest()[:40]


def version_tag(etag: str) -> str:
    """An upstream ETag as a file-name part: the characters an ETag is made of (hex digits, ``-``), quotes dropped."""
    return re.sub(r"[^0-9A-Za-z-]", "", etag)[:80]


class ChunkFiles:
    def __init__(self, root: Path, max_bytes: int, policy: str = "reuse", quotas: TenantQuotas | None = None) -> None:
        self.root, self.max_bytes = root, max_bytes
        self.tmp = root / "tmp"
        shutil.rmtree(self.tmp, ignore_errors=True)  # writes a crash interrupted
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.policy = DeferredTouches(make_policy(policy))  # a kv-get's touch waits for the next decision
        self.ledger = TenantLedger(quotas or TenantQuotas(max_bytes))
        self.versions: dict[str, str] = {}  # cid -> version_tag of its bytes ("" unknown)
        self.confirmed: dict[str, float] = {}  # cid -> when (monotonic) the copy was last known current; absent: never (a restart)
        self.reserved = 0
        self.evicted = 0
        self.unlinked: Callable[[Path], None] = lambda path: None  # told of every chunk file unlinked (its name may return)
        self._dirs: set[str] = set()  # subdirectories known to exist (a mkdir per commit was a syscall per chunk)
        self._rebuild()

    def path(self, cid: str, size: int) -> Path:
        version = self.versions.get(cid, "")
        return self.root / cid[:2] / (f"{cid}.{size}.{version}" if version else f"{cid}.{size}")

    def version(self, cid: str) -> str:
        """The upstream version (``version_tag`` of its ETag) the cached copy holds; "" if unknown."""
        return self.versions.get(cid, "")

    def _rebuild(self) -> None:
        """The index from the directory: oldest-written first (access order is not kept across restarts)."""
        found: list[tuple[float, str, int, str]] = []
        for sub in self.root.iterdir():
            if sub == self.tmp or not sub.is_dir():
                continue
            for f in sub.iterdir():
                cid, _, rest = f.name.partition(".")
                size, _, version = rest.partition(".")
                st = f.stat()
                if not size.isdigit() or st.st_size != int(size) or version != version_tag(version):
                    f.unlink(missing_ok=True)
                    continue
                found.append((st.st_mtime, cid, int(size), version))
        for _, cid, size, version in sorted(found):
            self.policy.add(cid, size)
            if version:
                self.versions[cid] = version
        self._evict(self.policy.used - self.max_bytes)  # max_bytes may have shrunk since

    def size(self, cid: str) -> int | None:
        return self.policy.size(cid)

    def _evict(self, need: int, tenant: str | None = None) -> bool:
        if need <= 0:
            return True
        victims = self.policy.victims(need, tenant=tenant)
        if victims is None:
            return False
        for cid in victims:
            self.ledger.evicted(self.policy.tenant_of(cid), cid, self.policy.size(cid) or 0)
            self.drop(cid)
            self.evicted += 1
        return True

    def reserve(self, nbytes: int, tenant: str = "") -> bool:
        """Room for ``nbytes`` more, evicting unpinned chunks as needed (``tenant``'s own first, beyond its bound);
        False if pinned chunks leave no room."""
        if tenant:
            self._evict(self.ledger.over(tenant, self.policy.tenant_used(tenant) + nbytes), tenant)
        if nbytes > self.max_bytes or not self._evict(self.policy.used + self.reserved + nbytes - self.max_bytes):
            return False
        self.reserved += nbytes
        return True

    def unreserve(self, nbytes: int) -> None:
        self.reserved -= nbytes

    def new_tmp(self) -> Path:
        return self.tmp / uuid.uuid4().hex

    def commit(self, cid: str, tmp: Path, size: int, etag: str = "", parent: str | None = None, tenant: str = "") -> Path:
        """A written temp file (its space reserved) becomes the cached chunk ``cid`` (the upstream's ``etag`` of it), newest."""
        self.reserved -= size
        old = self.policy.size(cid)
        if old is not None:
            self.drop(cid)
        if version_tag(etag):
            self.versions[cid] = version_tag(etag)
            self.confirmed[cid] = time.monotonic()
        final = self.path(cid, size)
        if cid[:2] not in self._dirs:
            final.parent.mkdir(exist_ok=True)
            self._dirs.add(cid[:2])
        os.rename(tmp, final)
        self.policy.add(cid, size, parent, tenant)
        self.ledger.stored(tenant, cid, size)
        return final

    def drop(self, cid: str) -> None:
        """Forget and unlink ``cid`` (a transfer holding it keeps reading through its descriptor)."""
        size = self.policy.size(cid)
        if size is not None:
            self.policy.remove(cid)
            path = self.path(cid, size)
            path.unlink(missing_ok=True)
            self.unlinked(path)
        self.versions.pop(cid, None)
        self.confirmed.pop(cid, None)

    def status(self) -> dict[str, int]:
        return {"bytes": self.policy.used, "max_bytes": self.max_bytes, "chunks": len(self.policy), "reserved": self.reserved,
                "pinned_bytes": self.policy.pinned_bytes, "evicted": self.evicted}

    def tenant_status(self) -> dict[str, dict[str, int]]:
        return self.ledger.status({t: self.policy.tenant_used(t) for t in self.ledger.tenants()})
