"""kv-put with x-oc-soft-pin-ttl on a live node (gateway + storage server, local backend): a soft-pinned system
prompt survives another tenant's flood while its TTL runs; a short-TTL one is evicted by the flood once its TTL
ended (bounded polling, no sleeps to a deadline); a soft pin beyond the tenant's bound is refused (InvalidRequest)
until an expiry frees room; soft pins on a node that does not allow them are refused."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from kvsupport import client, keys_for, make_chunks, rpc, run, tiny_layout
from support import ServerProcess, boto_client, make_tenants, write_config

from protocol.errors import S3Error

LAYOUT = tiny_layout(16, num_layers=8)  # a chunk is 256 bytes
C = LAYOUT.chunk_bytes
NODE_CHUNKS = 16
PIN_CHUNKS = 6  # bob's soft-pin bound


def _node(tmp_path: Path, pin_chunks: int):
    people = {t.name: t for t in make_tenants("alice", "bob")}
    sock = tmp_path / "ss.sock"
    config = write_config(tmp_path / "c.toml", tmp_path / "data", list(people.values()),
                          extra=f"\n[cache]\nmax_bytes = {NODE_CHUNKS * C}\nsoft_pin_tenant_max_bytes = {pin_chunks * C}\n"
                                f'soft_pin_max_ttl_s = 3600\n[storage_server]\nsocket = "{sock}"\n')
    proc = ServerProcess(config).start()
    for name, bucket in (("alice", "flood"), ("bob", "warm")):
        boto_client(proc.endpoint, people[name]).create_bucket(Bucket=bucket)
    return proc, people, str(sock)


async def _flood(alice, round_: int) -> None:
    keys = keys_for(LAYOUT, NODE_CHUNKS, f"one-off-{round_}")  # a whole node's worth of one-off chunks
    await alice.put_chunks(keys, make_chunks(LAYOUT, len(keys), seed=100 + round_), LAYOUT)


def test_a_soft_pinned_prefix_outlives_a_flood_until_its_ttl_and_the_bound_holds(tmp_path: Path):
    proc, people, sock = _node(tmp_path, PIN_CHUNKS)

    async def scenario() -> None:
        system = keys_for(LAYOUT, 4, "system-prompt")
        brief = keys_for(LAYOUT, 2, "short-lived")
        extra = keys_for(LAYOUT, 1, "one-more")
        async with client(proc, people["alice"], "flood") as alice, client(proc, people["bob"], "warm") as bob:
            await bob.put_chunks(system, make_chunks(LAYOUT, 4, seed=1), LAYOUT, soft_pin_s=3600)
            short_from = time.monotonic()
            await bob.put_chunks(brief, make_chunks(LAYOUT, 2, seed=2), LAYOUT, soft_pin_s=1)
            assert rpc(sock, "status")["soft_pinned_bytes"] == {"bob": PIN_CHUNKS * C}
            with pytest.raises(S3Error) as refused:  # the bound is full: refused before anything is stored
                await bob.put_chunks(extra, make_chunks(LAYOUT, 1, seed=3), LAYOUT, soft_pin_s=60)
            assert refused.value.code.name == "InvalidRequest" and "soft_pin_tenant_max_bytes" in str(refused.value)
            assert await bob.lookup(extra) == 0
            await _flood(alice, 0)
            assert await bob.lookup(system) == 4
            if time.monotonic() - short_from < 1:  # still within its TTL: the short-lived pin held too
                assert await bob.lookup(brief) == 2
            for round_ in range(1, 200):  # its TTL ends; a later flood takes it (bounded)
                await _flood(alice, round_)
                if await bob.lookup(brief) == 0:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the 1 s soft pin never expired")
            assert time.monotonic() - short_from >= 1
            assert await bob.lookup(system) == 4  # the long TTL still holds
            await bob.put_chunks(extra, make_chunks(LAYOUT, 1, seed=3), LAYOUT, soft_pin_s=60)  # room again
            assert rpc(sock, "status")["soft_pinned_bytes"] == {"bob": 5 * C}

    try:
        run(scenario())
    finally:
        proc.stop()


def test_soft_pins_are_refused_where_the_node_allows_none(tmp_path: Path):
    proc, people, _ = _node(tmp_path, 0)

    async def scenario() -> None:
        async with client(proc, people["bob"], "warm") as bob:
            with pytest.raises(S3Error, match="soft pins are off"):
                await bob.put_chunks(keys_for(LAYOUT, 1, "k"), make_chunks(LAYOUT, 1, seed=1), LAYOUT, soft_pin_s=10)

    try:
        run(scenario())
    finally:
        proc.stop()
