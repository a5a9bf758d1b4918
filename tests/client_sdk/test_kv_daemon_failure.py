"""The storage-server daemon dies mid-transfer: the client gets a clear error, the gateway keeps serving S3."""

from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest
from kvsupport import TRANSPORTS, client, keys_for, make_chunks, reference, rpc, run, tiny_layout
from support import ServerProcess, boto_client, free_port, make_tenants, split_serving, write_config

from client_sdk import ObjectCacheError


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_daemon_killed_mid_transfer(tmp_path, transport):
    """Gateway and storage server run as separate services (as under systemd).

    The bandwidth pool paces the transfer to about one layer per half second, so
    the daemon is killed (as soon as layer 0 has arrived) long before the last layer.
    """
    tenant = make_tenants("t")[0]
    sock = tmp_path / "ss.sock"
    layout = tiny_layout(16)
    layer_bytes = 64 * layout.per_layer_chunk_bytes
    gbps = layer_bytes * 2 * 8 / 1e9  # two layers per second
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra=(
        f'\n[storage_server]\nsocket = "{sock}"\n\n[bandwidth]\ncapacity_gbps = {gbps!r}\npolicy = "equal"\nburst_layers = 1\n'))
    storage = ServerProcess(config, command="storage-server").start()
    gateway = ServerProcess(config, command="gateway").start()
    try:
        s3 = boto_client(gateway.endpoint, tenant)
        s3.create_bucket(Bucket="kvb")
        keys = keys_for(layout, 64, "m")
        chunks = make_chunks(layout, 64, seed=3)

        async def scenario():
            async with client(gateway, tenant, "kvb") as c:
                await c.put_chunks(keys, chunks, layout)
                seen = []
                with pytest.raises(ObjectCacheError) as e:
                    async with c.fetch_layers(keys, layout, transport=transport, mode="layerwise") as layers:
                        async for idx, _ in layers:
                            seen.append(idx)
                            if idx == 0:
                                storage.kill()
                assert seen[-1] < layout.num_layers - 1, "the transfer finished before the kill"
                assert e.value.code.name == "ServiceUnavailable"
                assert "storage server" in e.value.message
                # The gateway still serves plain S3...
                s3.put_object(Bucket="kvb", Key="after", Body=b"still here")
                assert s3.get_object(Bucket="kvb", Key="after")["Body"].read() == b"still here"
                # ...while KV operations (the storage server owns the chunk store) are refused at once with 503.
                for operation in (c.lookup(keys), c.fetch(keys, layout, "http")):
                    with pytest.raises(ObjectCacheError) as e:
                        await asyncio.wait_for(operation, 10)
                    assert e.value.code.name == "ServiceUnavailable" and e.value.status == 503
                # Once the storage server is back, KV works again (the SDK re-registers its region).
                storage.start()
                assert await c.lookup(keys) == 64
                payload, _ = await c.fetch(keys, layout, transport)
                assert np.array_equal(payload, reference(layout, chunks))

        run(scenario())
    finally:
        gateway.stop()
        if storage.proc.poll() is None:
            storage.stop()


def test_serve_restarts_a_crashed_storage_server(tmp_path):
    tenant = make_tenants("t")[0]
    sock = tmp_path / "ss.sock"
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra=f'\n[storage_server]\nsocket = "{sock}"\n')
    proc = ServerProcess(config).start()
    try:
        pid = rpc(str(sock), "status")["pid"]
        os.kill(pid, signal.SIGKILL)
        s3 = boto_client(proc.endpoint, tenant)
        s3.create_bucket(Bucket="alive")  # the gateway never went away
        for _ in range(100):
            if any("storage server is back" in line for line in proc.output):
                break
            asyncio.run(asyncio.sleep(0.1))
        assert rpc(str(sock), "status")["pid"] != pid
    finally:
        assert proc.stop() == 0


def test_gateway_reaches_storage_server_over_tcp(tmp_path):
    port = free_port()
    tenant = make_tenants("t")[0]
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra=f'\n[storage_server]\ntcp = "127.0.0.1:{port}"\n')
    proc = ServerProcess(config).start()
    try:
        assert f"storage server: 127.0.0.1:{port}" in "".join(proc.output)
        boto_client(proc.endpoint, tenant).create_bucket(Bucket="kvtcp")
        layout = tiny_layout(64)
        keys, chunks = keys_for(layout, 20, "tcp"), make_chunks(layout, 20, seed=4)

        async def scenario():
            async with client(proc, tenant, "kvtcp") as c:
                await c.put_chunks(keys, chunks, layout)
                for transport in ("http", "shm"):
                    payload, _ = await c.fetch(keys, layout, transport, mode="layerwise")
                    assert np.array_equal(payload, reference(layout, chunks))

        run(scenario())
    finally:
        proc.stop()


def test_a_client_with_several_idle_regions_fetches_after_the_storage_server_restarts(tmp_path):
    """A restarted storage server knows none of the client's regions: the SDK drops them all and
    registers afresh, rather than retrying with another region the server has also forgotten."""
    with split_serving(tmp_path) as (storage, gateway, tenant):
        boto_client(gateway.endpoint, tenant).create_bucket(Bucket="kvr")
        layout = tiny_layout(16)
        keys, chunks = keys_for(layout, 8, "r"), make_chunks(layout, 8, seed=5)

        async def scenario():
            async with client(gateway, tenant, "kvr") as c:
                await c.put_chunks(keys, chunks, layout)
                await c.warm_up(layout.payload_bytes(len(keys)), regions=3)
                storage.stop()
                storage.start()
                payload, _ = await c.fetch(keys, layout, "shm")
                assert np.array_equal(payload, reference(layout, chunks))

        run(scenario())
