"""Decoded copies of compressed chunks (``compression.decoded_copies_bytes``): a warm kv-get the node would decode
reads a raw copy of each chunk instead, byte-exact; never a copy of bytes the key no longer holds; within its budget.

One ``objectcache serve`` (local store) whose copies hold 12 chunks' raw bytes; chunks are kv-put with zstd.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from compressionsupport import kv_chunks, kv_layout
from kvsupport import TRANSPORTS, client, keys_for, reference, rpc, run
from support import ServerProcess, boto_client, make_tenants, write_config

LAYOUT = kv_layout(64)
BUDGET_CHUNKS = 12


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("copies")
    people = make_tenants("alice")
    config = write_config(root / "c.toml", root / "data", people,
                          extra=f'\n[storage_server]\nsocket = "{root / "ss.sock"}"\n'
                                f"\n[compression]\ndecoded_copies_bytes = {BUDGET_CHUNKS * LAYOUT.chunk_bytes}\n"
                                "decode_on_put = false\n")  # copies after kv-gets only (after kv-puts: test_decode_on_put.py)
    proc = ServerProcess(config).start()
    proc.rpc_socket = str(root / "ss.sock")
    try:
        boto_client(proc.endpoint, people[0]).create_bucket(Bucket="kvz")
        yield proc, people[0]
    finally:
        proc.stop()


def _status(proc) -> dict:
    return rpc(proc.rpc_socket, "status")


def _copies_settled(proc) -> dict:
    """The copies' status once no fill is queued (bounded poll: fills run on a background thread after the kv-get)."""
    deadline = time.monotonic() + 60
    while (copies := _status(proc)["decoded_copies"])["pending"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert copies["pending"] == 0, copies
    return copies


def _decoded_bytes(proc) -> int:
    return int(_status(proc)["decode_pipeline"]["decompress"].get("bytes", 0))


def _put(proc, alice, keys, chunks) -> None:
    async def go():
        async with client(proc, alice, "kvz") as c:
            await c.put_chunks(keys, chunks, LAYOUT, codec="zstd")
    run(go())


def _fetch(proc, alice, keys, transport, **kw):
    async def go():
        async with client(proc, alice, "kvz") as c:
            return await c.fetch(keys, LAYOUT, transport, verify=True, **kw)
    return run(go())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_warm_kv_get_the_node_would_decode_reads_its_decoded_copies_byte_exact(node, transport):
    proc, alice = node
    keys, chunks = keys_for(LAYOUT, 4, f"warm-{transport}"), kv_chunks(LAYOUT, 4, seed=3)
    _put(proc, alice, keys, chunks)
    payload, first = _fetch(proc, alice, keys, transport, decode="node" if transport == "http" else "auto")
    assert np.array_equal(payload, reference(LAYOUT, chunks))
    assert first.server.decode_site["site"] == "node" and first.server.decode_site["decoded_copies"] == 0, first.server.decode_site
    fills = _copies_settled(proc)["fills"]
    decoded, hits = _decoded_bytes(proc), _status(proc)["decoded_copies"]["hits"]
    payload, second = _fetch(proc, alice, keys, transport, decode="node" if transport == "http" else "auto")
    assert np.array_equal(payload, reference(LAYOUT, chunks))  # the copies are the decoded bytes
    assert second.server.decode_site["decoded_copies"] == 4, second.server.decode_site
    assert _decoded_bytes(proc) == decoded  # nothing decoded this time
    copies = _copies_settled(proc)
    assert copies["hits"] == hits + 4 and copies["fills"] == fills  # read, not filled again
    assert copies["bytes"] <= copies["max_bytes"]


def test_a_kv_get_the_sdk_decodes_reads_the_stored_bytes_not_the_copies(node):
    proc, alice = node
    keys, chunks = keys_for(LAYOUT, 4, "client-decodes"), kv_chunks(LAYOUT, 4, seed=5)
    _put(proc, alice, keys, chunks)
    _fetch(proc, alice, keys, "http", decode="node")
    _copies_settled(proc)
    payload, stats = _fetch(proc, alice, keys, "http", decode="client")
    assert np.array_equal(payload, reference(LAYOUT, chunks))
    site = stats.server.decode_site
    assert site["site"] == "client" and "decoded_copies" not in site and site["wire_bytes"] < LAYOUT.payload_bytes(4), site


def test_an_overwritten_chunk_is_never_served_from_the_copy_of_its_old_bytes(node):
    proc, alice = node
    keys = keys_for(LAYOUT, 4, "overwritten")
    old, new = kv_chunks(LAYOUT, 4, seed=7), kv_chunks(LAYOUT, 4, seed=8)
    _put(proc, alice, keys, old)
    _fetch(proc, alice, keys, "shm")
    _copies_settled(proc)
    boto = boto_client(proc.endpoint, alice)
    for k in keys:
        boto.delete_object(Bucket="kvz", Key=k)
    _put(proc, alice, keys, new)
    payload, stats = _fetch(proc, alice, keys, "shm")
    assert np.array_equal(payload, reference(LAYOUT, new))
    assert stats.server.decode_site["decoded_copies"] == 0, stats.server.decode_site  # another file: decoded afresh


def test_copies_stay_within_their_budget_and_an_evicted_one_is_decoded_again(node):
    proc, alice = node
    n = 2 * BUDGET_CHUNKS
    keys, chunks = keys_for(LAYOUT, n, "budget"), kv_chunks(LAYOUT, n, seed=9)
    _put(proc, alice, keys, chunks)
    for i in range(0, n, 4):  # four chunks per kv-get: the first ones' copies are evicted for the later ones'
        _fetch(proc, alice, keys[i : i + 4], "shm")
        copies = _copies_settled(proc)
        assert copies["bytes"] <= copies["max_bytes"] and copies["chunks"] <= BUDGET_CHUNKS, copies
    assert copies["evicted"] > 0, copies
    payload, stats = _fetch(proc, alice, keys[:4], "shm")
    assert np.array_equal(payload, reference(LAYOUT, chunks[:4]))
    assert stats.server.decode_site["decoded_copies"] == 0, stats.server.decode_site  # evicted: decoded again


def test_decode_auto_on_a_slow_link_sends_the_stored_bytes_even_where_copies_exist(node):
    proc, alice = node
    keys, chunks = keys_for(LAYOUT, 4, "auto-slow"), kv_chunks(LAYOUT, 4, seed=11)
    _put(proc, alice, keys, chunks)
    _fetch(proc, alice, keys, "http", decode="node")
    assert _copies_settled(proc)["chunks"] >= 4
    _fetch(proc, alice, keys, "http", decode="client")  # the client's decode rate measured, as auto needs
    hits = _status(proc)["decoded_copies"]["hits"]

    async def go():
        async with client(proc, alice, "kvz") as c:
            c.link_gbps = 0.001  # declared: far slower than either side decodes
            return await c.fetch(keys, LAYOUT, "http", verify=True, mode="chunkwise")
    payload, stats = run(go())
    assert np.array_equal(payload, reference(LAYOUT, chunks))
    site = stats.server.decode_site
    assert site["site"] == "client" and "decoded_copies" not in site, site  # fewer bytes on the link beat the copies
    assert _status(proc)["decoded_copies"]["hits"] == hits


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("chunk_tokens", [16, 64, 256])
def test_copies_are_gathered_from_the_mapped_arena_like_raw_chunks_byte_exact(node, transport, chunk_tokens):
    """A warm kv-get of copies takes the raw chunks' path: every copy mapped, a layer gathered in one np.take."""
    proc, alice = node
    layout = kv_layout(chunk_tokens)
    keys, chunks = keys_for(layout, 3, f"gather-{transport}-{chunk_tokens}"), kv_chunks(layout, 3, seed=chunk_tokens)

    async def go(decode: str):
        async with client(proc, alice, "kvz") as c:
            await c.put_chunks(keys, chunks, layout, codec="zstd")  # an identical re-put is a no-op
            return await c.fetch(keys, layout, transport, verify=True, decode=decode)
    decode = "node" if transport == "http" else "auto"
    run(go(decode))
    _copies_settled(proc)
    payload, stats = run(go(decode))
    assert np.array_equal(payload, reference(layout, chunks))
    site = stats.server.decode_site
    assert site["decoded_copies"] == 3 and site["decoded_copies_read"] == "gathered", site


def test_raw_chunks_and_copies_in_one_kv_get_gather_from_one_arena(node):
    proc, alice = node
    keys, chunks = keys_for(LAYOUT, 4, "mixed"), kv_chunks(LAYOUT, 4, seed=13)

    async def go():
        async with client(proc, alice, "kvz") as c:
            await c.put_chunks(keys[:2], chunks[:2], LAYOUT)  # raw
            await c.put_chunks(keys[2:], chunks[2:], LAYOUT, codec="zstd")
            return await c.fetch(keys, LAYOUT, "shm", verify=True)
    run(go())
    _copies_settled(proc)
    payload, stats = run(go())
    assert np.array_equal(payload, reference(LAYOUT, chunks))
    site = stats.server.decode_site
    assert site["decoded_copies"] == 2 and site["decoded_copies_read"] == "gathered", site
