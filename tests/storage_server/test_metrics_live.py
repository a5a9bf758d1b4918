"""The storage server's gauges show a transfer while it runs: held mid-way by a gate, it is active, holds
staging memory and its tenant's bandwidth allocation; once it ends, all of that is back to zero."""

from __future__ import annotations

import asyncio

import pytest
from inprocess import InProcessNode, LayerGate
from kvsupport import client, keys_for, make_chunks, run, tiny_layout
from metricsupport import scrape, value
from support import boto_client, free_port, make_tenants, write_config


@pytest.fixture(scope="module")
def paced_node(tmp_path_factory):
    root = tmp_path_factory.mktemp("live")
    tenants = make_tenants("fast", "slow")
    port = free_port()
    config = write_config(root / "c.toml", root / "data", tenants, extra=(
        f'\n[storage_server]\nsocket = "{root / "ss.sock"}"\n'
        f'\n[bandwidth]\ncapacity_gbps = 8\n'
        f'\n[metrics]\nstorage_server_port = {port}\n'))
    gate = LayerGate()
    node = InProcessNode(config, pacers=[gate]).start()
    yield node, gate, tenants[0], port
    node.stop()


def test_a_running_transfer_is_active_holds_staging_and_its_tenants_bandwidth(paced_node):
    node, gate, tenant, port = paced_node
    boto_client(node.endpoint, tenant).create_bucket(Bucket="live")
    layout = tiny_layout(16)
    keys, chunks = keys_for(layout, 64, "live"), make_chunks(layout, 64, seed=5)
    meanwhile = {}

    async def fetch():
        async with client(node, tenant, "live") as c:
            await c.put_chunks(keys, chunks, layout)
            gate.hold_before(layout.num_layers // 2)
            async with c.fetch_layers(keys, layout, transport="http", mode="layerwise") as layers:
                it = layers.__aiter__()
                await asyncio.wait_for(it.__anext__(), 30)
                assert await asyncio.to_thread(gate.wait_held, 30)
                meanwhile.update(await asyncio.to_thread(scrape, port))
                assert gate.open()
                assert [i async for i, _ in it] == list(range(1, layout.num_layers))

    run(fetch())
    after = scrape(port)
    assert value(meanwhile, "objectcache_kv_transfers_active", mode="layerwise") == 1
    assert value(meanwhile, "objectcache_kv_staging_held_bytes") > 0
    assert value(meanwhile, "objectcache_bandwidth_allocated_bytes_per_second", tenant="fast") > 0
    assert value(meanwhile, "objectcache_bandwidth_allocated_bytes_per_second", tenant="slow") == 0
    assert value(meanwhile, "objectcache_bandwidth_capacity_bytes_per_second") == 8e9 / 8
    assert value(after, "objectcache_kv_transfers_active", mode="layerwise") == 0
    assert value(after, "objectcache_kv_staging_held_bytes") == 0
    assert value(after, "objectcache_bandwidth_allocated_bytes_per_second", tenant="fast") == 0
    assert value(after, "objectcache_kv_gets_total", mode="layerwise", transport="http", outcome="ok") == 1
