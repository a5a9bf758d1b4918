"""The storage-server daemon dies mid-transfer: the client gets a clear error, the gateway keeps serving S3."""

from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest

from client_sdk import ObjectCacheError
from kvsupport import client, keys_for, make_chunks, reference, rpc, run, tiny_layout
from support import ServerProcess, boto_client, make_tenants, write_config


@pytest.mark.parametrize("transport", ["shm", "http"])
def test_daemon_killed_mid_transfer(tmp_path, transport):
    """Gateway and storage server run as separate services (as under systemd)."""
    tenant = make_tenants("t")[0]
    sock = tmp_path / "ss.sock"
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant],
                          extra=f'\n[storage_server]\ntest_hooks = true\nsocket = "{sock}"\n')
    storage = ServerProcess(config, command="storage-server").start()
    gateway = ServerProcess(config, command="gateway").start()
    try:
        s3 = boto_client(gateway.endpoint, tenant)
        s3.create_bucket(Bucket="kvb")
        layout = tiny_layout(16)
        keys = keys_for(layout, 64, "m")
        chunks = make_chunks(layout, 64, seed=3)

        async def scenario():
            async with client(gateway, tenant, "kvb") as c:
                await c.put_chunks(keys, chunks, layout)
                assert rpc(str(sock), "test-hold", before_layer=2)["ok"]
                with pytest.raises(ObjectCacheError) as e:
                    async with c.fetch_layers(keys, layout, transport=transport, mode="layerwise") as layers:
                        async for idx, _ in layers:
                            if idx == 0:
                                assert rpc(str(sock), "test-wait-held")["held"]
                                storage.kill()
                assert e.value.code.name == "ServiceUnavailable"
                assert "storage server" in e.value.message
                # The gateway still serves plain S3 and KV lookups (metadata only)...
                s3.put_object(Bucket="kvb", Key="after", Body=b"still here")
                assert s3.get_object(Bucket="kvb", Key="after")["Body"].read() == b"still here"
                assert await c.lookup(keys) == 64
                # ...and a new transfer is refused at once with 503.
                with pytest.raises(ObjectCacheError) as e:
                    await asyncio.wait_for(c.fetch(keys, layout, "http"), 10)
                assert e.value.code.name == "ServiceUnavailable" and e.value.status == 503
                # Once the storage server is back, transfers work again (the SDK re-registers its region).
                storage.start()
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
    import socket as socketlib

    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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
