"""ObjectCache as LMCache's remote storage: created by LMCache's own backend factory from configuration only.

LMCache's vLLM connector needs a GPU, so the plugin is driven here the way LMCache drives it:
``CreateStorageBackends`` builds a ``RemoteBackend`` for the configured plugin, and its put, get,
contains and batched calls go to a real node. Every chunk must come back byte for byte.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
import time

import pytest
from kvsupport import rpc

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lmcache") is None, reason="LMCache is not installed (pip install 'objectcache[vllm]'; make test does)")

CHUNK = 16
SHAPE = (2, 2, CHUNK, 64)  # KV_2LTD: (K,V) × layers × tokens × kv_heads·head_dim


@pytest.fixture(scope="module")
def lmcache(server, tenants):
    """LMCache's storage backends for a config naming the plugin, on an event loop thread like LMCache's."""
    import torch
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend import CreateStorageBackends

    alice = tenants["alice"]
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=0.05, remote_serde="naive", remote_storage_plugins=["objectcache"],
        extra_config={"remote_storage_plugin.objectcache.module_path": "client_sdk.lmcache_plugin",
                      "remote_storage_plugin.objectcache.class_name": "ObjectCacheRemoteConnector",
                      "remote_storage_plugin.objectcache.endpoint": server.endpoint,
                      "remote_storage_plugin.objectcache.access_key": alice.access_key,
                      "remote_storage_plugin.objectcache.secret_key": alice.secret_key,
                      "remote_storage_plugin.objectcache.bucket": "lmcache-plugin"})
    metadata = LMCacheMetadata(model_name="tiny", world_size=1, local_world_size=1, worker_id=0, local_worker_id=0, kv_dtype=torch.bfloat16,
                               kv_shape=(SHAPE[1], 2, CHUNK, 2, 32), chunk_size=CHUNK)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    backends = CreateStorageBackends(config, metadata, loop, dst_device="cpu")
    yield backends
    for b in backends.values():
        b.close()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _key(h: int):
    import torch
    from lmcache.utils import CacheEngineKey

    return CacheEngineKey("tiny", 1, 0, h, torch.bfloat16)


def _chunks(cpu, n: int, seed: int, tokens: int = CHUNK):
    import torch
    from lmcache.v1.memory_management import MemoryFormat

    g = torch.Generator().manual_seed(seed)
    objs = []
    for _ in range(n):
        obj = cpu.allocate([torch.Size((SHAPE[0], SHAPE[1], tokens, SHAPE[3]))], [torch.bfloat16], MemoryFormat.KV_2LTD)
        obj.tensor.copy_(torch.randn(obj.tensor.shape, generator=g).to(torch.bfloat16))
        objs.append(obj)
    return objs


def _wait(predicate, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_plugin_is_created_from_configuration_alone(lmcache):
    remote = lmcache["RemoteBackend-objectcache"]
    assert "ObjectCacheRemoteConnector" in repr(remote.connection)


def test_batched_put_then_batched_get_round_trips_byte_exact_in_one_kv_get(lmcache, server):
    remote, cpu = lmcache["RemoteBackend-objectcache"], lmcache["LocalCPUBackend"]
    keys = [_key(1000 + i) for i in range(6)]
    objs = _chunks(cpu, 6, seed=1)
    assert remote.batched_contains(keys) == 0
    remote.batched_submit_put_task(keys, objs)
    _wait(lambda: remote.batched_contains(keys) == 6)
    assert remote.contains(keys[3]) and not remote.contains(_key(999))
    assert remote.batched_contains(keys[:2] + [_key(999)] + keys[2:]) == 2  # leading hits, as LMCache's prefix lookups want
    before = rpc(server.rpc_socket, "status")["transfers_completed"]
    got = remote.batched_get_blocking(keys)
    # The node counts a kv-get before it sends the end frame: a client holding its bytes sees it counted.
    assert rpc(server.rpc_socket, "status")["transfers_completed"] == before + 1, "batched_get was not one kv-get"
    assert [bytes(g.byte_array) for g in got] == [bytes(o.byte_array) for o in objs]
    assert all(g.tensor.shape == objs[0].tensor.shape and g.tensor.dtype == objs[0].tensor.dtype for g in got)
    single = remote.get_blocking(keys[5])
    assert bytes(single.byte_array) == bytes(objs[5].byte_array)


def test_a_batched_put_is_one_kv_put_request(lmcache, monkeypatch):
    """LMCache's batched put of several chunks reaches the node as one kv-put (counted on the wire:
    every request the SDK sends goes through ObjectCacheClient._post)."""
    from client_sdk.client import ObjectCacheClient
    from protocol.kv_http import KVOp

    sent: list[KVOp] = []
    real_post = ObjectCacheClient._post

    async def counting_post(self, path, op, body, **kw):
        sent.append(op)
        return await real_post(self, path, op, body, **kw)

    monkeypatch.setattr(ObjectCacheClient, "_post", counting_post)
    remote, cpu = lmcache["RemoteBackend-objectcache"], lmcache["LocalCPUBackend"]
    keys = [_key(3100 + i) for i in range(5)]  # its own keys: chunks are immutable, and 3000.. belong to the re-put test
    remote.batched_submit_put_task(keys, _chunks(cpu, 5, seed=5))
    _wait(lambda: not any(remote.exists_in_put_tasks(k) for k in keys) and remote.batched_contains(keys) == 5)
    assert sent.count(KVOp.PUT) == 1, sent


def test_a_partial_chunk_and_a_missing_key(lmcache):
    """The last chunk of a prompt is shorter: its header gives its shape back; a key never stored is a miss."""
    remote, cpu = lmcache["RemoteBackend-objectcache"], lmcache["LocalCPUBackend"]
    full, partial = _chunks(cpu, 1, seed=2)[0], _chunks(cpu, 1, seed=3, tokens=5)[0]
    keys = [_key(2000), _key(2001)]
    remote.batched_submit_put_task(keys, [full, partial])
    _wait(lambda: remote.batched_contains(keys) == 2)
    got = remote.batched_get_blocking(keys)
    assert bytes(got[0].byte_array) == bytes(full.byte_array)
    assert bytes(got[1].byte_array) == bytes(partial.byte_array) and got[1].tensor.shape == partial.tensor.shape
    assert remote.get_blocking(_key(2999)) is None
    missing = remote.batched_get_blocking([_key(2000), _key(2999)])
    assert bytes(missing[0].byte_array) == bytes(full.byte_array) and missing[1] is None


def test_re_putting_identical_chunks_is_harmless(lmcache):
    remote, cpu = lmcache["RemoteBackend-objectcache"], lmcache["LocalCPUBackend"]
    keys = [_key(3000), _key(3001)]
    objs = _chunks(cpu, 2, seed=4)
    for _ in range(2):
        remote.batched_submit_put_task(keys, objs)
        _wait(lambda: remote.batched_contains(keys) == 2 and not any(remote.exists_in_put_tasks(k) for k in keys))
    assert remote.put_failed_count == 0
    assert [bytes(g.byte_array) for g in remote.batched_get_blocking(keys)] == [bytes(o.byte_array) for o in objs]
