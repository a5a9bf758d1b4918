"""Decoded copies made right after a kv-put (``compression.decode_on_put``, on by default): the first kv-get of
compressed chunks reads copies, byte-exact, with nothing decoded by its own pipeline; those speculative copies never
evict a copy another tenant's kv-get read.

One ``objectcache serve`` (local store) whose copies hold 64 chunks' raw bytes; alice and bob each have a bucket.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from compressionsupport import kv_chunks, kv_layout
from kvsupport import TRANSPORTS, client, keys_for, reference, rpc, run
from support import ServerProcess, boto_client, make_tenants, write_config

LAYOUT = kv_layout(64)
BUDGET_CHUNKS = 64  # room for every test's copies but the burst that overfills it


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("decode-on-put")
    people = make_tenants("alice", "bob")
    config = write_config(root / "c.toml", root / "data", people,
                          extra=f'\n[storage_server]\nsocket = "{root / "ss.sock"}"\n'
                                f'\n[compression]\ndecoded_copies_bytes = {BUDGET_CHUNKS * LAYOUT.chunk_bytes}\nlossy_buckets = ["lossy"]\n')
    proc = ServerProcess(config).start()
    proc.rpc_socket = str(root / "ss.sock")
    try:
        boto_client(proc.endpoint, people[0]).create_bucket(Bucket="kvz")
        boto_client(proc.endpoint, people[0]).create_bucket(Bucket="lossy")
        boto_client(proc.endpoint, people[1]).create_bucket(Bucket="bobz")
        yield proc, people[0], people[1]
    finally:
        proc.stop()


def _copies(proc) -> dict:
    return rpc(proc.rpc_socket, "status")["decoded_copies"]


def _settled(proc) -> dict:
    """The copies' status once no fill (after a kv-put or a kv-get) is queued: a bounded poll."""
    deadline = time.monotonic() + 120
    while (copies := _copies(proc))["pending"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert copies["pending"] == 0, copies
    return copies


def _decoded_bytes(proc) -> int:
    return int(rpc(proc.rpc_socket, "status")["decode_pipeline"]["decompress"].get("bytes", 0))


def _put(proc, tenant, bucket, keys, chunks, codec="zstd") -> None:
    async def go():
        async with client(proc, tenant, bucket) as c:
            await c.put_chunks(keys, chunks, LAYOUT, codec=codec)
    run(go())


def _fetch(proc, tenant, bucket, keys, transport="shm", verify=True, **kw):
    async def go():
        async with client(proc, tenant, bucket) as c:
            return await c.fetch(keys, LAYOUT, transport, verify=verify, **kw)
    return run(go())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_first_kv_get_after_a_kv_put_reads_the_copies_made_after_the_put_byte_exact(node, transport):
    proc, alice, _ = node
    keys, chunks = keys_for(LAYOUT, 4, f"first-{transport}"), kv_chunks(LAYOUT, 4, seed=21)
    before = _settled(proc)["prefills"]
    _put(proc, alice, "kvz", keys, chunks)
    copies = _settled(proc)
    assert copies["prefills"] == before + 4, copies  # decoded after the put, before any kv-get asked
    decoded = _decoded_bytes(proc)
    payload, stats = _fetch(proc, alice, "kvz", keys, transport, decode="node" if transport == "http" else "auto")
    assert np.array_equal(payload, reference(LAYOUT, chunks))
    site = stats.server.decode_site
    assert site["site"] == "node" and site["decoded_copies"] == 4 and site["decoded_copies_read"] == "gathered", site
    assert _decoded_bytes(proc) == decoded  # the first kv-get decoded nothing


def test_a_lossy_chunks_copy_holds_exactly_what_the_sdk_decodes_from_the_stored_bytes(node):
    proc, alice, _ = node
    keys, chunks = keys_for(LAYOUT, 3, "int4"), kv_chunks(LAYOUT, 3, seed=22)
    _put(proc, alice, "lossy", keys, chunks, codec="int4")
    _settled(proc)
    from_copies, stats = _fetch(proc, alice, "lossy", keys, "shm", verify=False)
    assert stats.server.decode_site["decoded_copies"] == 3, stats.server.decode_site
    by_sdk, stats = _fetch(proc, alice, "lossy", keys, "http", verify=False, decode="client")
    assert stats.server.decode_site["site"] == "client", stats.server.decode_site
    assert np.array_equal(from_copies, by_sdk)  # byte for byte the stored chunk's decode
    assert not np.array_equal(by_sdk, reference(LAYOUT, chunks))  # int4 really is lossy (the test is not vacuous)


def test_a_kv_get_racing_the_copies_of_its_kv_put_is_byte_exact(node):
    proc, alice, _ = node
    for r in range(3):
        keys, chunks = keys_for(LAYOUT, 4, f"race-{r}"), kv_chunks(LAYOUT, 4, seed=30 + r)

        async def go():
            async with client(proc, alice, "kvz") as c:
                await c.put_chunks(keys, chunks, LAYOUT, codec="zstd")
                return await c.fetch(keys, LAYOUT, "shm", verify=True)  # at once: the copies may or may not be there
        payload, stats = run(go())
        assert np.array_equal(payload, reference(LAYOUT, chunks))
        assert 0 <= stats.server.decode_site.get("decoded_copies", 0) <= 4, stats.server.decode_site
    _settled(proc)


def test_a_rewritten_chunk_is_copied_from_its_new_bytes(node):
    proc, alice, _ = node
    keys = keys_for(LAYOUT, 4, "rewritten")
    old, new = kv_chunks(LAYOUT, 4, seed=41), kv_chunks(LAYOUT, 4, seed=42)
    _put(proc, alice, "kvz", keys, old)
    _settled(proc)
    boto = boto_client(proc.endpoint, alice)
    for k in keys:
        boto.delete_object(Bucket="kvz", Key=k)
    _put(proc, alice, "kvz", keys, new)
    _settled(proc)
    payload, stats = _fetch(proc, alice, "kvz", keys, "shm")
    assert np.array_equal(payload, reference(LAYOUT, new))
    assert stats.server.decode_site["decoded_copies"] == 4, stats.server.decode_site


def test_another_tenants_kv_puts_never_evict_the_copies_a_kv_get_read(node):
    proc, alice, bob = node
    keys, chunks = keys_for(LAYOUT, 4, "alice-reads"), kv_chunks(LAYOUT, 4, seed=51)
    _put(proc, alice, "kvz", keys, chunks)
    _settled(proc)
    _, stats = _fetch(proc, alice, "kvz", keys, "shm")  # read: from now on ordinary copies of alice's
    assert stats.server.decode_site["decoded_copies"] == 4, stats.server.decode_site
    settled = _settled(proc)
    evicted, prefills = settled["evicted"], settled["prefills"]
    n = 2 * BUDGET_CHUNKS
    bob_keys = keys_for(LAYOUT, n, "bob-burst")
    for i in range(0, n, 16):  # a burst of kv-puts, more than the whole budget
        _put(proc, bob, "bobz", bob_keys[i : i + 16], kv_chunks(LAYOUT, 16, seed=60 + i))
    copies = _settled(proc)
    assert copies["bytes"] <= copies["max_bytes"] and copies["chunks"] <= BUDGET_CHUNKS, copies
    assert copies["prefills"] > prefills, copies  # bob's chunks were copied where there was room
    assert copies["prefill_skipped"] + copies["evicted"] > evicted, copies  # bob's burst did not all fit
    payload, stats = _fetch(proc, alice, "kvz", keys, "shm")
    assert np.array_equal(payload, reference(LAYOUT, chunks))
    assert stats.server.decode_site["decoded_copies"] == 4, stats.server.decode_site  # alice's copies all stayed
