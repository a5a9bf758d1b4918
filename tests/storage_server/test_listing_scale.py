"""Listing stays correct with 100,000 keys in one bucket (through the real gateway)."""

from __future__ import annotations

import asyncio

from storage_server.store import PutSpec
from storage_server.store.localdisk import LocalDiskStore

N = 100_000


def test_hundred_thousand_keys(server, s3, bucket):
    # Load through the store library into the server's own data directory (the
    # same path the storage-server daemon uses); the gateway sees them at once.
    data_dir = server.config.read_text().split('data_dir = "')[1].split('"')[0]
    keys = [f"dir{i % 100:02d}/obj{i:06d}" for i in range(N)]

    async def load() -> None:
        store = LocalDiskStore(data_dir, io_threads=2)
        spec = PutSpec()
        for start in range(0, N, 10_000):
            await store.put_many(bucket, [(k, b"", spec) for k in keys[start : start + 10_000]], "alice")
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
