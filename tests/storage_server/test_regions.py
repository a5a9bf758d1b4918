"""Registered shm regions: a client that vanishes without unregistering does not leak them."""

from __future__ import annotations

import time

import numpy as np
import pytest
from kvsupport import client, keys_for, make_chunks, reference, rpc, run, tiny_layout
from support import boto_client, serving

from client_sdk.buffers import SHM_DIR, ShmRegion
from protocol.errors import S3Error
from protocol.wire import TransportKind
from storage_server.regions import RegionRegistry


@pytest.fixture
def segments():
    made: list[ShmRegion] = []

    def make() -> ShmRegion:
        made.append(ShmRegion(4096))
        return made[-1]

    yield make
    for s in made:
        s.close()


def register(registry: RegionRegistry, segment: ShmRegion, tenant: str = "t"):
    return registry.register(tenant, segment.name, segment.size, segment.nonce)


def test_idle_regions_expire_but_regions_in_use_do_not(segments):
    registry = RegionRegistry()
    idle, busy = register(registry, segments()), register(registry, segments())
    busy.in_use = 1
    assert registry.expire(idle_s=60, now=time.monotonic() + 30) == 0
    assert registry.expire(idle_s=60, now=time.monotonic() + 120) == 1
    with pytest.raises(S3Error) as e:
        registry.resolve("t", idle.region_id, idle.token, 0, 0)
    assert e.value.code.name == "KVNoSuchRegion"
    assert registry.resolve("t", busy.region_id, busy.token, 0, 0) is busy
    busy.in_use = 0
    registry.close()


def test_a_tenant_at_its_cap_loses_its_least_recently_used_idle_region(segments):
    registry = RegionRegistry(max_regions_per_tenant=2)
    first, second = register(registry, segments()), register(registry, segments())
    registry.resolve("t", first.region_id, first.token, 0, 0)  # first is now the more recently used
    third = register(registry, segments())
    assert len(registry) == 2
    with pytest.raises(S3Error):
        registry.resolve("t", second.region_id, second.token, 0, 0)
    first.in_use = third.in_use = 1
    with pytest.raises(S3Error) as e:
        register(registry, segments())
    assert e.value.code.name == "ServiceUnavailable" and "all in use" in e.value.message
    register(registry, segments(), tenant="other")  # the cap is per tenant
    first.in_use = third.in_use = 0
    registry.close()


def test_regions_of_a_vanished_client_expire_and_the_sdk_registers_again(tmp_path):
    with serving(tmp_path, region_idle_s=0.3, housekeeping_s=0.1) as (proc, tenant, sock):
        boto_client(proc.endpoint, tenant).create_bucket(Bucket="regions")
        layout = tiny_layout(16, num_layers=4)
        keys, chunks = keys_for(layout, 8, "regions"), make_chunks(layout, 8, seed=4)

        async def scenario():
            async with client(proc, tenant, "regions") as c:
                await c.put_chunks(keys, chunks, layout)
                await c.fetch(keys, layout, "shm")
                # Registered, the segment's name is gone: a crash here leaks nothing in /dev/shm.
                assert not [p for p in SHM_DIR.glob("objectcache-*") if p.name in {r.region.name for r in c._destinations[TransportKind.SHM].pool._regions}]
                assert rpc(str(sock), "status")["regions"] == 1
                deadline = time.monotonic() + 10
                while rpc(str(sock), "status")["regions"] and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert rpc(str(sock), "status")["regions"] == 0  # expired while idle
                payload, _ = await c.fetch(keys, layout, "shm")  # KVNoSuchRegion → the SDK registers afresh
                assert np.array_equal(payload, reference(layout, chunks))

        run(scenario())
