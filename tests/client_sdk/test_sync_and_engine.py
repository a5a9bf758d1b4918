"""The synchronous facade, the vLLM-shaped engine adapter, and the runnable example."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from kvsupport import keys_for, make_chunks, reference, tiny_layout
from support import REPO

from client_sdk import ObjectCacheError
from client_sdk.engine import ObjectCacheKVConnector
from client_sdk.sync import SyncObjectCacheClient


@pytest.fixture
def sync_client(server, tenants):
    c = SyncObjectCacheClient(server.endpoint, tenants["alice"].access_key, tenants["alice"].secret_key, bucket="kv-sync")
    c.ensure_bucket()
    yield c
    c.close()


def test_sync_facade(sync_client):
    layout = tiny_layout(16)
    keys = keys_for(layout, 40, "sync")
    chunks = make_chunks(layout, 40, seed=11)
    assert sync_client.put_chunks(keys, chunks, layout) == 40
    assert sync_client.lookup(keys) == 40
    expected = reference(layout, chunks)
    with sync_client.fetch_layers(keys, layout, "shm", mode="layerwise") as layers:
        got = [(i, np.frombuffer(v, np.uint8).copy()) for i, v in layers]
    assert [i for i, _ in got] == list(range(layout.num_layers))
    assert all(np.array_equal(v, expected[i]) for i, v in got)
    payload, stats = sync_client.fetch(keys, layout, "http")
    assert np.array_equal(payload, expected) and stats.transport == "http"


@pytest.mark.parametrize("transport", ["shm", "http"])
def test_connector_loads_layer_by_layer_and_saves(sync_client, transport):
    layout = tiny_layout(16, num_layers=8)
    keys = keys_for(layout, 30, f"engine-{transport}")
    # Save: the engine produces KV one layer at a time.
    connector = ObjectCacheKVConnector(sync_client, layout, transport)
    rng = np.random.default_rng(3)
    produced = [rng.integers(0, 256, size=connector.layer_shape(30), dtype=np.uint8) for _ in range(layout.num_layers)]
    for layer, kv in enumerate(produced):
        connector.save_kv_layer(layer, kv, keys=keys)
    assert connector.wait_for_save() == 30
    # Load into engine-owned buffers, waiting layer by layer.
    caches = [np.zeros(connector.layer_shape(30), np.uint8) for _ in range(layout.num_layers)]
    connector.start_load_kv(keys, caches)
    for layer in range(layout.num_layers):
        assert np.array_equal(connector.wait_for_layer_load(layer), produced[layer])
    connector.wait_for_load()


def test_connector_surfaces_load_errors(sync_client):
    layout = tiny_layout(16, num_layers=4)
    connector = ObjectCacheKVConnector(sync_client, layout, "http")
    connector.start_load_kv(["engine/never-stored"])
    with pytest.raises(ObjectCacheError) as e:
        connector.wait_for_layer_load(0)
    assert e.value.code.name == "NoSuchKey"


def test_example_serving_loop_runs(server, tenants):
    env = {**os.environ, "PYTHONPATH": str(REPO), "AWS_ACCESS_KEY_ID": tenants["alice"].access_key,
           "AWS_SECRET_ACCESS_KEY": tenants["alice"].secret_key, "AWS_ENDPOINT_URL": server.endpoint}
    r = subprocess.run([sys.executable, "-m", "client_sdk.examples.serving_loop", "--context", "512", "--hit", "0.5",
                        "--layer-compute-ms", "0.5"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "TTFT layer-overlapped" in r.stdout and "16 chunks (256 tokens) cached" in r.stdout


def test_ensure_bucket_creates_a_missing_bucket_but_never_hides_a_refusal(server, tenants):
    bob = tenants["bob"]
    alice = SyncObjectCacheClient(server.endpoint, tenants["alice"].access_key, tenants["alice"].secret_key, bucket="kv-ensure-owned")
    intruder = SyncObjectCacheClient(server.endpoint, bob.access_key, bob.secret_key, bucket="kv-ensure-owned")
    try:
        alice.ensure_bucket()
        alice.ensure_bucket()  # exists: nothing to do
        with pytest.raises(Exception) as refused:
            intruder.ensure_bucket()  # alice's bucket: bob's HEAD is refused, and that is what he must see
        assert "403" in str(refused.value) or "Forbidden" in str(refused.value) or "AccessDenied" in str(refused.value)
    finally:
        alice.close()
        intruder.close()
