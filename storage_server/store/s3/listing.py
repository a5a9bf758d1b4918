"""ListObjects over the upstream: its pages merged into one key order, reserved keys hidden.

The upstream returns keys and common prefixes in two sorted lists; they are merged
here, ``.objectcache/`` entries are dropped, and a common prefix at or before the
continuation marker (``after`` = the last prefix of the previous page) is skipped, so
pagination never repeats a prefix whatever the upstream does with a prefix marker.
Asking for one more entry than the page holds tells whether the listing is truncated.
"""

from __future__ import annotations

from typing import Any

from protocol.errors import ErrorCode

from ..object_store import ListPage, ObjectMeta
from .buckets import is_reserved
from .upstream import Upstream


def _entry_meta(bucket: str, o: dict[str, Any]) -> ObjectMeta:
    return ObjectMeta(bucket=bucket, key=o["Key"], size=int(o["Size"]), etag=o["ETag"], last_modified=o["LastModified"].timestamp(),
                      storage_class=o.get("StorageClass") or "STANDARD")


async def list_page(up: Upstream, bucket: str, prefix: str, delimiter: str, after: str, limit: int, hide_reserved: bool = True) -> ListPage:
    entries: list[tuple[str, ObjectMeta | None]] = []  # (key or prefix, meta or None for a prefix)
    scope = {k: v for k, v in (("Prefix", prefix), ("Delimiter", delimiter)) if v}
    args: dict[str, Any] = {"Bucket": bucket, **scope, **({"StartAfter": after} if after else {})}
    while len(entries) <= limit:
        resp = await up.call("list_objects_v2", MaxKeys=min(1000, limit + 1 - len(entries)), missing=ErrorCode.NoSuchBucket,
                             resource=f"/{bucket}", **args)
        batch: list[tuple[str, ObjectMeta | None]] = [(o["Key"], _entry_meta(bucket, o)) for o in resp.get("Contents", [])]
        batch += [(p["Prefix"], None) for p in resp.get("CommonPrefixes", [])]
        batch.sort(key=lambda e: e[0].encode())
        for name, meta in batch:
            if hide_reserved and is_reserved(name):
                continue
            if meta is None and name <= after and after.startswith(name):
                continue  # the prefix the previous page ended with
            entries.append((name, meta))
        token = resp.get("NextContinuationToken")
        if not resp.get("IsTruncated") or not token:
            break
        args = {"Bucket": bucket, **scope, "ContinuationToken": token}
    page, truncated = entries[:limit], len(entries) > limit
    return ListPage(objects=[m for _, m in page if m is not None], common_prefixes=[n for n, m in page if m is None],
                    is_truncated=truncated, next_marker=page[-1][0] if truncated and page else None)
