"""cache.tenant_max_bytes: a tenant flooding the node's chunk cache evicts its own chunks, not another tenant's warm prefix.

Real processes (gateway + storage server, local backend). Bob's warm prefix is stored and
read; Alice then puts four times the node's bound. With a per-tenant bound Alice only
evicts her own chunks and Bob's lookups keep hitting; without one (the control) Bob's
prefix is evicted, so the test can tell the two apart. The per-tenant counts in the
storage server's status move by the amounts the sequence implies.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kvsupport import client, keys_for, make_chunks, rpc, run, tiny_layout
from metricsupport import scrape, value
from support import ServerProcess, boto_client, free_port, make_tenants, write_config

LAYOUT = tiny_layout(16, num_layers=8)  # a chunk is 256 bytes
C = LAYOUT.chunk_bytes
NODE_CHUNKS = 16
QUOTA_CHUNKS = 8
BATCHES = 8  # Alice's flood: 8 puts of 8 chunks = four times the node's bound


def _node(tmp_path: Path, policy: str, quota_chunks: int):
    people = {t.name: t for t in make_tenants("alice", "bob")}
    sock = tmp_path / "ss.sock"
    port = free_port()
    config = write_config(tmp_path / "c.toml", tmp_path / "data", list(people.values()),
                          extra=f'\n[cache]\nmax_bytes = {NODE_CHUNKS * C}\npolicy = "{policy}"\n'
                                f"tenant_max_bytes = {quota_chunks * C}\n"
                                f'[storage_server]\nsocket = "{sock}"\n[metrics]\nstorage_server_port = {port}\n')
    return ServerProcess(config).start(), people, str(sock), port


async def _put(c, keys: list[str], seed: int) -> None:
    assert await c.put_chunks(keys, make_chunks(LAYOUT, len(keys), seed=seed), LAYOUT) == len(keys)


async def _scenario(proc, people, sock: str, port: int, quota: int) -> None:
    batches = [keys_for(LAYOUT, 8, f"one-off-{b}") for b in range(BATCHES)]
    prefix = keys_for(LAYOUT, 6, "system-prompt")
    async with client(proc, people["alice"], "flood") as alice, client(proc, people["bob"], "warm") as bob:
        assert await bob.lookup(prefix) == 0
        await _put(bob, prefix, seed=1)
        assert await bob.lookup(prefix) == 6
        for b, keys in enumerate(batches):
            await _put(alice, keys, seed=10 + b)
        kept = await bob.lookup(prefix)
        tenants = rpc(sock, "status")["cache_tenants"]
        if not quota:
            assert kept < 6  # the control: without a per-tenant bound the flood takes Bob's prefix
            return
        assert kept == 6
        assert tenants["bob"] == {"bytes": 6 * C, "max_bytes": QUOTA_CHUNKS * C, "hits": 12, "misses": 6, "evictions": 0,
                                  "evicted_bytes": 0, "reused_after_eviction": 0, "reuse_gap_bytes": 0}
        assert tenants["alice"]["bytes"] == QUOTA_CHUNKS * C
        assert tenants["alice"]["evictions"] == (BATCHES - 1) * 8 and tenants["alice"]["evicted_bytes"] == (BATCHES - 1) * 8 * C
        samples = scrape(port)  # the same counts as Prometheus series
        assert value(samples, "objectcache_cache_tenant_hits_total", tenant="bob") == 12
        assert value(samples, "objectcache_cache_tenant_misses_total", tenant="bob") == 6
        assert value(samples, "objectcache_cache_tenant_evictions_total", tenant="alice") == (BATCHES - 1) * 8
        assert value(samples, "objectcache_cache_tenant_bytes", tenant="alice") == QUOTA_CHUNKS * C
        # Alice's first batch (evicted when her second one was stored) is stored again: eight reuses after eviction,
        # each gap the bytes the node stored between its eviction and its return.
        await _put(alice, batches[0], seed=10)
        alice_now = rpc(sock, "status")["cache_tenants"]["alice"]
        stored_before = 6 * C + BATCHES * 8 * C  # Bob's prefix, then the flood
        evicted_at = 6 * C + 2 * 8 * C
        assert alice_now["reused_after_eviction"] == 8
        assert alice_now["reuse_gap_bytes"] == sum(stored_before + i * C - evicted_at for i in range(8))


@pytest.mark.parametrize(("policy", "quota"), [("lru", QUOTA_CHUNKS), ("prefix", QUOTA_CHUNKS), ("prefix", 0)],
                         ids=["lru", "prefix", "prefix-no-quota-control"])
def test_a_flooding_tenant_evicts_its_own_chunks_and_the_other_keeps_its_warm_prefix(tmp_path: Path, policy: str, quota: int):
    proc, people, sock, port = _node(tmp_path, policy, quota)
    try:
        boto_client(proc.endpoint, people["alice"]).create_bucket(Bucket="flood")
        boto_client(proc.endpoint, people["bob"]).create_bucket(Bucket="warm")
        run(_scenario(proc, people, sock, port, quota))
    finally:
        proc.stop()
