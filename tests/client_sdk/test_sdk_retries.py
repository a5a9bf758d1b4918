"""The SDK rides out a gateway restart: idempotent calls retry with bounded backoff, then fail with its own error.

The gateway and the storage server run as separate services (as under systemd), so the
gateway can be stopped and started again on the same port while the storage server keeps
the chunks.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
from kvsupport import keys_for, make_chunks, reference, run, tiny_layout
from support import ServerProcess, boto_client, make_tenants, write_config

from client_sdk import ObjectCacheClient, ObjectCacheError


@pytest.fixture
def services(tmp_path):
    tenant = make_tenants("t")[0]
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra=f'\n[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\n')
    storage = ServerProcess(config, command="storage-server").start()
    gateway = ServerProcess(config, command="gateway").start()
    boto_client(gateway.endpoint, tenant).create_bucket(Bucket="retry-kv")
    try:
        yield storage, gateway, tenant
    finally:
        for proc in (gateway, storage):
            if proc.proc.poll() is None:
                proc.stop()


def sdk(gateway, tenant, **options) -> ObjectCacheClient:
    return ObjectCacheClient(gateway.endpoint, tenant.access_key, tenant.secret_key, bucket="retry-kv", **options)


def test_calls_made_while_the_gateway_restarts_succeed_through_the_retry(services, caplog):
    storage, gateway, tenant = services
    layout = tiny_layout(16, num_layers=4)
    keys, chunks = keys_for(layout, 24, "restart"), make_chunks(layout, 24, seed=5)
    port = gateway.port

    async def scenario():
        # Up to ~13 s of waiting (0.1, 0.2, 0.4, 0.8, 1.6, then 2 s each): longer than a gateway restart takes.
        async with sdk(gateway, tenant, retries=10, backoff=0.1) as c:
            await c.put_chunks(keys[:12], chunks[:12], layout)
            assert await c.lookup(keys) == 12  # the pool now holds a keep-alive connection the restart will cut
            gateway.stop()
            calls = [asyncio.create_task(c.lookup(keys[:12])), asyncio.create_task(c.put_chunks(keys[12:], chunks[12:], layout)),
                     asyncio.create_task(c.status())]
            await asyncio.sleep(0.5)
            assert not any(t.done() for t in calls), "with the gateway down the calls wait and retry, they neither succeed nor fail"
            await asyncio.to_thread(gateway.start, port)
            hits, stored, status = await asyncio.wait_for(asyncio.gather(*calls), 30)
            assert hits == 12 and stored == 12 and isinstance(status, dict)
            assert await c.lookup(keys) == 24
            payload, _ = await c.fetch(keys, layout, "http")
            assert np.array_equal(payload, reference(layout, chunks))

    with caplog.at_level(logging.INFO, logger="objectcache.client"):
        run(scenario())
    retried = {r.getMessage().split(":")[0] for r in caplog.records if "retry" in r.getMessage()}
    assert {"kv-lookup of 12 key(s)", "kv-put of 12 chunk(s)", "kv-status"} <= retried


@pytest.mark.parametrize("transport", ["http", "shm"])
def test_a_fetch_started_while_the_gateway_restarts_succeeds_through_the_retry(services, transport):
    storage, gateway, tenant = services
    layout = tiny_layout(16, num_layers=4)
    keys, chunks = keys_for(layout, 8, "fetch-restart"), make_chunks(layout, 8, seed=6)
    port = gateway.port

    async def scenario():
        # local_session=False: shm kv-gets through the gateway (the local fast path would not notice its restart).
        async with sdk(gateway, tenant, retries=10, backoff=0.1, local_session=False) as c:
            await c.put_chunks(keys, chunks, layout)
            await c.fetch(keys, layout, transport)  # shm: the region is registered before the restart
            gateway.stop()
            fetch = asyncio.create_task(c.fetch(keys, layout, transport))
            await asyncio.sleep(0.5)
            assert not fetch.done()
            await asyncio.to_thread(gateway.start, port)
            payload, _ = await asyncio.wait_for(fetch, 30)
            assert np.array_equal(payload, reference(layout, chunks))

    run(scenario())


def test_with_the_gateway_down_for_good_every_call_raises_service_unavailable_after_its_retries(services, caplog):
    storage, gateway, tenant = services
    layout = tiny_layout(16, num_layers=4)
    keys, chunks = keys_for(layout, 4, "down"), make_chunks(layout, 4, seed=7)

    async def scenario():
        async with sdk(gateway, tenant, retries=2, backoff=0.05) as c:
            await c.put_chunks(keys, chunks, layout)
            gateway.stop()
            calls = {
                "kv-lookup": lambda: c.lookup(keys),
                "kv-put": lambda: c.put_chunks(keys, chunks, layout),
                "kv-get": lambda: c.fetch(keys, layout, "http"),
                "kv-register": lambda: c.fetch(keys, layout, "shm"),  # a fresh client has no region yet: registering fails first
                "kv-status": lambda: c.status(),
            }
            for what, call in calls.items():
                caplog.clear()
                with pytest.raises(ObjectCacheError) as e:
                    await asyncio.wait_for(call(), 30)  # a bound against a hang, not a timing claim
                assert e.value.code.name == "ServiceUnavailable" and e.value.status == 503, what
                assert e.value.message.startswith(what) and "failed after 3 attempt(s)" in e.value.message, e.value.message
                assert str(gateway.port) in e.value.message  # says which gateway could not be reached
                # Bounded by count, not by a clock: exactly the 2 retries asked for, then the error.
                retries = [r.getMessage() for r in caplog.records if "; retry " in r.getMessage()]
                assert [m.split("; retry ")[1].split(" in ")[0] for m in retries] == ["1 of 2", "2 of 2"], retries

    with caplog.at_level(logging.INFO, logger="objectcache.client"):
        run(scenario())


def test_retries_0_fails_at_once_and_a_non_503_error_is_never_retried(services, caplog):
    storage, gateway, tenant = services
    layout = tiny_layout(16, num_layers=4)

    async def scenario():
        async with sdk(gateway, tenant, retries=3, backoff=0.05) as c:
            with pytest.raises(ObjectCacheError) as e:  # 404: the first missing chunk, at once
                await c.fetch(keys_for(layout, 2, "absent"), layout, "http")
            assert e.value.code.name == "NoSuchKey"
        async with sdk(gateway, tenant, retries=0) as c:
            gateway.stop()
            with pytest.raises(ObjectCacheError) as e:
                await c.lookup(keys_for(layout, 2, "absent"))
            assert e.value.code.name == "ServiceUnavailable" and "failed after 1 attempt(s)" in e.value.message

    with caplog.at_level(logging.INFO, logger="objectcache.client"):
        run(scenario())
    assert not [r for r in caplog.records if "retry" in r.getMessage()]


@pytest.mark.parametrize("transport", ["http", "shm"])
def test_a_stream_that_already_delivered_layers_is_not_retried(tmp_path, caplog, transport):
    """The gateway dies after layer 0 arrived: the caller gets ObjectCacheError at once, no silent second transfer."""
    tenant = make_tenants("t")[0]
    layout = tiny_layout(16)
    layer_bytes = 64 * layout.per_layer_chunk_bytes
    gbps = layer_bytes * 2 * 8 / 1e9  # two layers per second: the kill lands long before the last layer
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra=(
        f'\n[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\n\n[bandwidth]\ncapacity_gbps = {gbps!r}\npolicy = "equal"\nburst_layers = 1\n'))
    storage = ServerProcess(config, command="storage-server").start()
    gateway = ServerProcess(config, command="gateway").start()
    try:
        boto_client(gateway.endpoint, tenant).create_bucket(Bucket="retry-kv")
        keys, chunks = keys_for(layout, 64, "mid"), make_chunks(layout, 64, seed=8)

        async def scenario():
            async with sdk(gateway, tenant, retries=10, backoff=0.1, local_session=False) as c:  # shm through the gateway too
                await c.put_chunks(keys, chunks, layout)
                seen = []
                with pytest.raises(ObjectCacheError) as e:
                    async with c.fetch_layers(keys, layout, transport=transport, mode="layerwise") as layers:
                        async for idx, _ in layers:
                            seen.append(idx)
                            if idx == 0:
                                gateway.kill()
                assert seen[0] == 0 and seen[-1] < layout.num_layers - 1, "the transfer finished before the kill"
                assert e.value.code.name == "ServiceUnavailable"  # at once: no retry is logged (below), no clock read

        with caplog.at_level(logging.INFO, logger="objectcache.client"):
            run(scenario())
        assert not [r for r in caplog.records if "retry" in r.getMessage()]
    finally:
        gateway.stop()
        storage.stop()
