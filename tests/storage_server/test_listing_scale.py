"""Listing stays correct with 100,000 keys in one bucket (through the real gateway)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support import boto_client, serving

from storage_server.store import PutSpec
from storage_server.store.localdisk import LocalDiskStore

N = 100_000


def test_hundred_thousand_keys(tmp_path):
    # A server of its own: the 100,000 objects go away with its data directory, not through 100 DeleteObjects
    # calls on the suite's shared server (that teardown alone ran past five minutes on a loaded CI machine).
    with serving(tmp_path) as (server, tenant, _):
        s3 = boto_client(server.endpoint, tenant)
        s3.create_bucket(Bucket="listing")
        check_listing(s3, "listing", tmp_path / "data", tenant.name)


def check_listing(s3, bucket: str, data_dir: Path, owner: str) -> None:
    # Load through the store library into the server's own data directory (the
    # same path the storage-server daemon uses); the gateway sees them at once.
    keys = [f"dir{i % 100:02d}/obj{i:06d}" for i in range(N)]

    async def load() -> None:
        store = LocalDiskStore(data_dir, io_threads=2)
        spec = PutSpec()
        for start in range(0, N, 10_000):
            await store.put_many(bucket, [(k, b"", spec) for k in keys[start : start + 10_000]], owner)
        await store.close()

    asyncio.run(load())

    listed = []
    pages = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        listed += [o["Key"] for o in page["Contents"]]
        pages += 1
    assert listed == sorted(keys) and pages == N // 1000

    r = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == [f"dir{i:02d}/" for i in range(100)]
    assert not r["IsTruncated"]

    r = s3.list_objects_v2(Bucket=bucket, Prefix="dir42/", StartAfter="dir42/obj050042", MaxKeys=3)
    assert [o["Key"] for o in r["Contents"]] == ["dir42/obj050142", "dir42/obj050242", "dir42/obj050342"]
