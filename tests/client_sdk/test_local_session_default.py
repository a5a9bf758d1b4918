"""The SDK takes the local fast path by default where the node offers it, and the gateway where it does not."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from kvsupport import keys_for, make_chunks, reference, run, tiny_layout
from support import ServerProcess, boto_client, make_tenants, write_config

from client_sdk import ObjectCacheClient, ObjectCacheError


def test_a_default_client_sends_shm_kv_gets_to_the_session_socket_and_local_session_false_to_the_gateway(server, tenants, s3):
    bucket = "local-session-default"
    s3.create_bucket(Bucket=bucket)
    layout = tiny_layout(16, num_layers=4)
    keys, chunks = keys_for(layout, 12, "default"), make_chunks(layout, 12, seed=31)
    t = tenants["alice"]

    async def scenario():
        async with ObjectCacheClient(server.endpoint, t.access_key, t.secret_key, bucket=bucket) as fast, \
                ObjectCacheClient(server.endpoint, t.access_key, t.secret_key, bucket=bucket, local_session=False) as gateway:
            await fast.put_chunks(keys, chunks, layout)
            for c, session in ((fast, True), (gateway, False), (fast, True)):
                payload, stats = await c.fetch(keys, layout, "shm")
                assert np.array_equal(payload, reference(layout, chunks))
                # The session path has no gateway: the node names the request ("L…") and no gateway time is reported.
                assert (stats.direct, stats.server.request_id.startswith("L"), stats.gateway_s == 0) == (session,) * 3, stats
                assert stats.request_id == stats.server.request_id

    run(scenario())


@pytest.fixture
def no_fast_path(tmp_path):
    tenant = make_tenants("nf")[0]
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra="\n[storage_server]\nmax_sessions_per_tenant = 0\n")
    node = ServerProcess(config).start()
    try:
        boto_client(node.endpoint, tenant).create_bucket(Bucket="no-fast-path")
        yield node, tenant
    finally:
        node.stop()


def test_where_the_node_offers_no_fast_path_a_default_client_uses_the_gateway_and_an_explicit_one_is_refused(no_fast_path, caplog):
    node, t = no_fast_path
    layout = tiny_layout(16, num_layers=4)
    keys, chunks = keys_for(layout, 6, "no-fast-path"), make_chunks(layout, 6, seed=32)

    async def scenario():
        async with ObjectCacheClient(node.endpoint, t.access_key, t.secret_key, bucket="no-fast-path") as c:
            await c.put_chunks(keys, chunks, layout)
            for _ in range(2):
                payload, stats = await c.fetch(keys, layout, "shm")
                assert np.array_equal(payload, reference(layout, chunks)) and not stats.direct and stats.gateway_s > 0
        async with ObjectCacheClient(node.endpoint, t.access_key, t.secret_key, bucket="no-fast-path", local_session=True) as strict:
            with pytest.raises(ObjectCacheError) as e:
                await strict.fetch(keys, layout, "shm")
            assert e.value.code.name == "NotImplemented" and "max_sessions_per_tenant" in e.value.message

    with caplog.at_level(logging.INFO, logger="objectcache.client"):
        run(scenario())
    # Asked once: the answer is remembered, later fetches go straight to the gateway.
    stepped_aside = [r for r in caplog.records if "through the gateway" in r.getMessage()]
    assert len(stepped_aside) == 1 and "no local fast path" in stepped_aside[0].getMessage(), [r.getMessage() for r in caplog.records]
