"""Eviction under ``cache.max_bytes`` (local backend) removes only the chunk it admitted, never what now lives under its key.

The chunk bound remembers the chunks a kv-put stored. A chunk deleted through the gateway
and replaced by a plain object (or its bucket deleted and recreated by another tenant who
puts a plain object under the same key) is no longer that chunk: evicting it must leave
the user's object alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kvsupport import client, keys_for, make_chunks, run, tiny_layout
from support import ServerProcess, boto_client, make_tenants, write_config

LAYOUT = tiny_layout(16, num_layers=8)  # a chunk is 256 bytes
BOUND_CHUNKS = 8


@pytest.fixture
def node(tmp_path: Path):
    people = {t.name: t for t in make_tenants("alice", "bob")}
    config = write_config(tmp_path / "c.toml", tmp_path / "data", list(people.values()),
                          extra=f"\n[cache]\nmax_bytes = {BOUND_CHUNKS * LAYOUT.chunk_bytes}\n"
                                f'[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\n')
    proc = ServerProcess(config).start()
    try:
        yield proc, people
    finally:
        proc.stop()


async def _put(node, tenant, bucket: str, keys: list[str], seed: int) -> None:
    async with client(node, tenant, bucket) as c:
        assert await c.put_chunks(keys, make_chunks(LAYOUT, len(keys), seed=seed), LAYOUT) == len(keys)


def _pressure(node, tenant, bucket: str) -> None:
    """Three times the bound of new chunks: every older unpinned chunk the node remembers is evicted."""
    boto_client(node.endpoint, tenant).create_bucket(Bucket=bucket)
    run(_put(node, tenant, bucket, keys_for(LAYOUT, 3 * BOUND_CHUNKS, bucket), seed=2))


def test_a_plain_object_put_where_an_evictable_chunk_was_is_never_evicted(node):
    proc, people = node
    alice = boto_client(proc.endpoint, people["alice"])
    alice.create_bucket(Bucket="alices")
    keys = keys_for(LAYOUT, 4, "doc")
    run(_put(proc, people["alice"], "alices", keys, seed=1))
    alice.delete_objects(Bucket="alices", Delete={"Objects": [{"Key": k} for k in keys]})
    alice.put_object(Bucket="alices", Key=keys[0], Body=b"alice's own document")
    _pressure(proc, people["bob"], "bobs")
    assert alice.get_object(Bucket="alices", Key=keys[0])["Body"].read() == b"alice's own document"


def test_a_recreated_bucket_of_another_tenant_keeps_its_plain_objects_under_eviction(node):
    proc, people = node
    alice, bob = boto_client(proc.endpoint, people["alice"]), boto_client(proc.endpoint, people["bob"])
    alice.create_bucket(Bucket="handed-on")
    keys = keys_for(LAYOUT, 4, "doc")
    run(_put(proc, people["alice"], "handed-on", keys, seed=1))
    alice.delete_objects(Bucket="handed-on", Delete={"Objects": [{"Key": k} for k in keys]})
    alice.delete_bucket(Bucket="handed-on")
    bob.create_bucket(Bucket="handed-on")
    bob.put_object(Bucket="handed-on", Key=keys[1], Body=b"bob's plain object")
    _pressure(proc, people["alice"], "alice-more")
    assert bob.get_object(Bucket="handed-on", Key=keys[1])["Body"].read() == b"bob's plain object"


def test_a_chunk_still_in_place_is_evicted_as_before(node):
    proc, people = node
    alice = boto_client(proc.endpoint, people["alice"])
    alice.create_bucket(Bucket="evictable")
    keys = keys_for(LAYOUT, 4, "kv")
    run(_put(proc, people["alice"], "evictable", keys, seed=1))
    _pressure(proc, people["alice"], "alice-more")
    listed = alice.list_objects_v2(Bucket="evictable").get("Contents", [])
    assert listed == []  # the chunks it admitted, unchanged, went
