"""Abandoned multipart uploads are aborted after ``storage_server.abort_incomplete_uploads_s``, or
sooner where the bucket's lifecycle configuration says so.

An upload cut off by Ctrl-C or a crashed client keeps its parts for ever otherwise. The rule is
S3's ``AbortIncompleteMultipartUpload``, counted from the upload's initiation: the configured expiry
for every bucket, and each bucket's own enabled rules for the keys under their prefixes (whichever
comes first, :func:`storage_server.store.abort_after_s`). The storage server's housekeeping runs
:func:`abort_expired` on either backend through the :class:`ObjectStore` interface (with the s3
backend every node may run it: an upload another node aborted first is simply gone).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from protocol.errors import ErrorCode, S3Error
from storage_server.store import LifecycleRule, ObjectStore, UploadInfo, abort_after_s

log = logging.getLogger("objectcache.storage_server")

PAGE = 1000
MAX_SWEEP_INTERVAL_S = 3600.0


def expired(uploads: Sequence[UploadInfo], now: float, after_s: float, rules: Sequence[LifecycleRule] = ()) -> list[UploadInfo]:
    """The uploads initiated longer ago than ``after_s`` or their bucket's ``rules`` allow (0 and no rule: never)."""
    out = []
    for u in uploads:
        limit = abort_after_s(u.key, rules, after_s)
        if limit > 0 and now - u.initiated > limit:
            out.append(u)
    return out


def sweep_interval(after_s: float, housekeeping_s: float) -> float:
    """How often to look: a quarter of the expiry (an upload outlives it by at most that), no more
    often than housekeeping runs and at least hourly (listing every bucket's uploads is not free;
    lifecycle rules count in whole days, so hourly serves them too, also with the expiry off)."""
    if after_s <= 0:
        return max(housekeeping_s, MAX_SWEEP_INTERVAL_S)
    return max(housekeeping_s, min(after_s / 4, MAX_SWEEP_INTERVAL_S))


async def abort_expired(store: ObjectStore, now: float, after_s: float) -> int:
    """Abort every expired upload in every bucket (``after_s`` and each bucket's lifecycle rules); how many were aborted."""
    aborted = 0
    for bucket in await store.bucket_names():
        try:
            rules = (await store.get_bucket(bucket)).lifecycle
        except S3Error as e:
            if e.code is ErrorCode.NoSuchBucket:  # deleted meanwhile
                continue
            raise
        if after_s <= 0 and not any(r.enabled for r in rules):
            continue
        after_key = after_upload = ""
        while True:
            try:
                page = await store.list_uploads(bucket, "", after_key, after_upload, PAGE)
            except S3Error as e:
                if e.code is ErrorCode.NoSuchBucket:  # deleted meanwhile
                    break
                raise
            for listed in expired(page, now, after_s, rules):
                try:
                    # The store's own record of the upload decides (an upstream's listing may not carry
                    # the real initiation time: moto's is a constant from 2010).
                    upload = await store.get_upload(bucket, listed.key, listed.upload_id)
                    if expired([upload], now, after_s, rules):
                        await store.abort_upload(upload)
                        aborted += 1
                except S3Error as e:
                    if e.code is not ErrorCode.NoSuchUpload:  # completed or aborted meanwhile (another node)
                        raise
            if len(page) < PAGE:
                break
            after_key, after_upload = page[-1].key, page[-1].upload_id
    if aborted:
        log.info("housekeeping: aborted %d multipart upload(s) past their expiry (%g s, or their bucket's lifecycle rule)", aborted, after_s)
    return aborted


class UploadSweep:
    """Runs :func:`abort_expired` from the housekeeping loop every :func:`sweep_interval`; a failed
    sweep (an upstream outage) is logged and tried again at the next interval."""

    def __init__(self, store: ObjectStore, after_s: float, housekeeping_s: float, clock=time.time) -> None:
        self.store, self.after_s, self.clock = store, after_s, clock
        self.interval = sweep_interval(after_s, housekeeping_s)
        self._next = 0.0

    async def maybe_run(self) -> int:
        now = self.clock()
        if now < self._next:
            return 0
        self._next = now + self.interval
        try:
            return await abort_expired(self.store, now, self.after_s)
        except S3Error as e:
            if e.code is not ErrorCode.NotImplemented:  # a store without bucket_names: nothing to sweep
                log.warning("housekeeping: aborting abandoned uploads failed (%s); retrying in %g s", e, self.interval)
            return 0
