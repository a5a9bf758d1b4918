"""warm_up: the first shm fetch's set-up (region creation, registration, page faults) done ahead of it.

Correctness only (bench/first_fetch.py measures the time): after warm_up the region exists,
is registered, both mappings are faulted in, and a fetch uses it and delivers the right bytes.
"""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest
from kvsupport import client, keys_for, make_chunks, reference, rpc, run, tiny_layout

from client_sdk import ObjectCacheClient
from client_sdk.buffers import ShmRegion
from protocol.shm import populate

LAYOUT = tiny_layout(16, num_layers=8)
N = 32
# An unusual size (whole pages, above the pool's 64 MiB minimum) picks our mapping out of /proc/PID/smaps.
WARM_BYTES = 70 * 1024 * 1024 + 7 * mmap.PAGESIZE


def memfd_mappings(pid: int | str, size: int) -> list[tuple[int, int]]:
    """(Size, Rss) in bytes of each objectcache memfd mapping of ``size`` bytes in process ``pid``."""
    out, current = [], None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if "-" in line.split(" ", 1)[0] and len(line.split()) >= 5:
                current = "memfd:objectcache-kv" in line
                fields: dict[str, int] = {}
            elif current and line.split(":")[0] in ("Size", "Rss"):
                fields[line.split(":")[0]] = int(line.split()[1]) * 1024
                if len(fields) == 2 and fields["Size"] == size:
                    out.append((fields["Size"], fields["Rss"]))
    return out


@pytest.fixture(scope="module")
def stored(server, tenants, s3):
    bucket = "kv-warm-up"
    s3.create_bucket(Bucket=bucket)
    keys, chunks = keys_for(LAYOUT, N, "warm"), make_chunks(LAYOUT, N, seed=31)

    async def put():
        async with client(server, tenants["alice"], bucket) as c:
            await c.put_chunks(keys, chunks, LAYOUT)

    run(put())
    return bucket, keys, chunks


def test_warm_up_registers_a_faulted_in_region_that_the_first_fetch_uses(server, tenants, stored):
    bucket, keys, chunks = stored
    server_pid = rpc(server.rpc_socket, "status")["pid"]

    async def scenario():
        async with client(server, tenants["alice"], bucket) as c:
            before = (await c.status())["regions"]  # the tenant's regions: other clients' tests may hold some
            await c.warm_up(WARM_BYTES)
            assert (await c.status())["regions"] == before + 1
            # Every page is mapped in this process and in the storage server before any fetch.
            assert memfd_mappings("self", WARM_BYTES) == [(WARM_BYTES, WARM_BYTES)]
            assert memfd_mappings(server_pid, WARM_BYTES) == [(WARM_BYTES, WARM_BYTES)]
            payload, stats = await c.fetch(keys, LAYOUT, "shm")
            assert np.array_equal(payload, reference(LAYOUT, chunks)) and stats.transport == "shm"
            assert (await c.status())["regions"] == before + 1, "the fetch reused the warmed region instead of registering another"
            await c.warm_up(WARM_BYTES)  # a region that fits is there: nothing new
            assert (await c.status())["regions"] == before + 1
        assert memfd_mappings(server_pid, WARM_BYTES) == []  # unregistered on close

    run(scenario())


def test_warm_up_for_concurrent_fetches_and_at_connect(server, tenants, stored):
    bucket, keys, chunks = stored

    async def scenario():
        async with client(server, tenants["alice"], bucket) as probe:
            before = (await probe.status())["regions"]  # the tenant's regions: other clients' tests may hold some
        async with ObjectCacheClient(server.endpoint, tenants["alice"].access_key, tenants["alice"].secret_key, bucket,
                                     shm_prefault_bytes=LAYOUT.payload_bytes(N)) as c:
            assert (await c.status())["regions"] == before + 1
            await c.warm_up(LAYOUT.payload_bytes(N), regions=3)
            assert (await c.status())["regions"] == before + 3
            with pytest.raises(ValueError):
                await c.warm_up(0)

    run(scenario())


def test_populate_keeps_what_the_memory_holds():
    region = ShmRegion(4 * 1024 * 1024)
    try:
        data = os.urandom(region.size // 2)
        region.view[: len(data)] = data
        populate(region.mm, region.size)
        assert bytes(region.view[: len(data)]) == data and not any(region.view[len(data):len(data) + 4096])
    finally:
        region.close()
