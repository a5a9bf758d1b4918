"""Registered shm regions: a client that vanishes without unregistering does not leak them."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from kvsupport import client, keys_for, make_chunks, reference, rpc, run, tiny_layout
from support import boto_client, serving

from client_sdk.buffers import ShmRegion
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
    """Both steps: the ticket (signed HTTP in real life), then the hand-over of the memfd."""
    return registry.complete(registry.offer(tenant, segment.size).secret, segment.fd)


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
    # Idle 2 s before it expires: long enough that the status read right after the kv-get still finds the region on a
    # loaded machine (at 0.3 s it had expired before that read in one CI run), short beside the 10 s wait for expiry.
    with serving(tmp_path, region_idle_s=2.0, housekeeping_s=0.1) as (proc, tenant, sock):
        boto_client(proc.endpoint, tenant).create_bucket(Bucket="regions")
        layout = tiny_layout(16, num_layers=4)
        keys, chunks = keys_for(layout, 8, "regions"), make_chunks(layout, 8, seed=4)

        async def scenario():
            async with client(proc, tenant, "regions") as c:
                await c.put_chunks(keys, chunks, layout)
                await c.fetch(keys, layout, "shm")
                # Registered, the client keeps no descriptor: the memory lives only in the two mappings.
                assert [r.region.fd for r in c._destinations[TransportKind.SHM].pool._regions] == [None]
                assert rpc(str(sock), "status")["regions"] == 1
                deadline = time.monotonic() + 10
                while rpc(str(sock), "status")["regions"] and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert rpc(str(sock), "status")["regions"] == 0  # expired while idle
                payload, _ = await c.fetch(keys, layout, "shm")  # KVNoSuchRegion → the SDK registers afresh
                assert np.array_equal(payload, reference(layout, chunks))

        run(scenario())


def test_only_a_memfd_sealed_against_shrinking_is_accepted(tmp_path, segments):
    """The server maps only memory that can never shrink under it (a shrinking segment killed it with SIGBUS)."""
    registry = RegionRegistry()
    unsealed = os.memfd_create("unsealed", os.MFD_ALLOW_SEALING)
    plain = os.open(tmp_path / "plain-file", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        for fd in (unsealed, plain):
            os.ftruncate(fd, 4096)
            with pytest.raises(S3Error) as e:
                registry.complete(registry.offer("t", 4096).secret, fd)
            assert e.value.code.name == "InvalidArgument" and "sealed" in e.value.message
        short = segments()
        with pytest.raises(S3Error) as e:
            registry.complete(registry.offer("t", short.size + 1).secret, short.fd)
        assert e.value.code.name == "InvalidArgument" and "fewer than" in e.value.message
        assert len(registry) == 0
    finally:
        os.close(unsealed)
        os.close(plain)


def test_a_ticket_is_redeemed_once_before_it_expires_and_binds_its_tenant(segments):
    registry = RegionRegistry()
    ticket = registry.offer("alice", 4096)
    region = registry.complete(ticket.secret, segments().fd)
    assert region.tenant == "alice" and region.size == 4096
    with pytest.raises(S3Error) as e:
        registry.complete(ticket.secret, segments().fd)  # used
    assert e.value.code.name == "AccessDenied"
    late = registry.offer("alice", 4096, now=0.0)
    with pytest.raises(S3Error) as e:
        registry.complete(late.secret, segments().fd, now=3600.0)  # expired
    assert e.value.code.name == "AccessDenied"
    with pytest.raises(S3Error) as e:
        registry.resolve("bob", region.region_id, region.token, 0, 0)  # the capability is alice's alone
    assert e.value.code.name == "AccessDenied"
    registry.close()


def test_the_client_cannot_shrink_a_registered_region():
    region = ShmRegion(8192)
    try:
        with pytest.raises(PermissionError):
            os.ftruncate(region.fd, 4096)
    finally:
        region.close()


def test_populated_bytes_are_bounded_per_tenant_and_unpopulated_regions_are_not_counted(segments):
    registry = RegionRegistry(populate_max_bytes=3 * 4096)
    for _ in range(2):
        segment = segments()
        registry.complete(registry.offer("t", segment.size, populate=True).secret, segment.fd)
    registry.offer("t", 4096, populate=True)  # a pending ticket counts as well: this is the third
    with pytest.raises(S3Error) as refused:
        registry.offer("t", 4096, populate=True)
    assert refused.value.code.name == "InvalidArgument" and refused.value.extra["ArgumentName"] == "populate"
    assert "storage_server.populate_max_bytes" in str(refused.value)
    registry.offer("t", 1 << 39)  # not populated: the server touches only what transfers write
    registry.offer("u", 4096, populate=True)  # another tenant has its own budget


def test_a_region_dropped_while_a_cut_transfer_still_holds_a_slice_closes_without_error():
    """A reader thread of a transfer cut short may still hold a slice of the region when it is dropped: closing does
    not raise, the slice stays writable, and the mapping goes once the slice does."""
    import mmap
    import weakref

    from storage_server.regions import MappedRegion

    mm = mmap.mmap(-1, 4096)
    region = MappedRegion(b"r" * 16, b"t" * 16, "alice", 4096, mm=mm)
    held = region.view[100:200]  # what a cut transfer's reader still writes into
    region.close()  # raised BufferError before
    held[:3] = b"abc"
    assert not mm.closed and bytes(mm[100:103]) == b"abc"
    gone = weakref.ref(mm)
    del held, region, mm
    assert gone() is None  # nothing else kept the mapping


def test_a_region_unregistered_while_a_transfer_writes_into_it_goes_when_that_transfer_lets_go(segments):
    """An abandoned fetch's SDK unregisters its region while the transfer is still stopping: no kv-get can name it from
    then on, and its memory is let go of at the transfer's release (refused before, the region stayed until it expired)."""
    registry = RegionRegistry()
    region = register(registry, segments())
    region.hold()
    registry.unregister("t", region.region_id, region.token)
    with pytest.raises(S3Error) as e:
        registry.resolve("t", region.region_id, region.token, 0, 1)
    assert e.value.code.name == "KVNoSuchRegion"
    assert len(registry) == 1 and not region.mm.closed  # the transfer still writes into it; its bytes still count
    region.release()
    assert len(registry) == 0 and region.mm.closed
