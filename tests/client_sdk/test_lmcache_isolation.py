"""Keys through the LMCache plugin never cross tenants, salts or models.

Two tenants' LMCache instances (each its own credentials and bucket) store the identical chunk
under the identical LMCache key: neither sees the other's, by ``contains``/``get`` and by the
objects each bucket holds. Within one tenant, salts travel as LMCache tags (``lmcache.tag.*``
request configs; LMCache 0.5.6's vLLM adapter drops vLLM's ``cache_salt``): different salts, a
salt and none, and tag values holding LMCache's own separators never share an object; nor do
keys of another model, dtype, world size or worker.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
import time

import pytest
from support import boto_client

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lmcache") is None, reason="LMCache is not installed (pip install 'objectcache[vllm]'; make test does)")

CHUNK = 16
SHAPE = (2, 2, CHUNK, 64)  # KV_2LTD


def _backends(server, tenant, bucket: str):
    import torch
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend import CreateStorageBackends

    prefix = "remote_storage_plugin.objectcache."
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=0.05, remote_serde="naive", remote_storage_plugins=["objectcache"],
        extra_config={prefix + "module_path": "client_sdk.lmcache_plugin", prefix + "class_name": "ObjectCacheRemoteConnector",
                      prefix + "endpoint": server.endpoint, prefix + "access_key": tenant.access_key,
                      prefix + "secret_key": tenant.secret_key, prefix + "bucket": bucket})
    metadata = LMCacheMetadata(model_name="tiny", world_size=1, local_world_size=1, worker_id=0, local_worker_id=0, kv_dtype=torch.bfloat16,
                               kv_shape=(SHAPE[1], 2, CHUNK, 2, 32), chunk_size=CHUNK)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    backends = CreateStorageBackends(config, metadata, loop, dst_device="cpu")

    def close() -> None:
        for b in backends.values():
            b.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    return backends, close


@pytest.fixture(scope="module")
def pair(server, tenants):
    """Carol's and Dave's LMCache, each on its own bucket (the tenant model: a bucket is its creator's)."""
    carol, c_close = _backends(server, tenants["carol"], "lmc-carol")
    dave, d_close = _backends(server, tenants["dave"], "lmc-dave")
    yield carol, dave
    c_close()
    d_close()


def _key(h: int, salt: dict | None = None, model: str = "tiny", world: int = 1, worker: int = 0, dtype=None):
    import torch
    from lmcache.utils import CacheEngineKey

    configs = {f"lmcache.tag.{k}": v for k, v in (salt or {}).items()}
    return CacheEngineKey(model, world, worker, h, dtype or torch.bfloat16, request_configs=configs)


def _chunk(cpu, seed: int):
    import torch
    from lmcache.v1.memory_management import MemoryFormat

    obj = cpu.allocate([torch.Size(SHAPE)], [torch.bfloat16], MemoryFormat.KV_2LTD)
    obj.tensor.copy_(torch.randn(obj.tensor.shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16))
    return obj


def _put(backends, keys, seed: int) -> None:
    remote, cpu = backends["RemoteBackend-objectcache"], backends["LocalCPUBackend"]
    remote.batched_submit_put_task(keys, [_chunk(cpu, seed + i) for i in range(len(keys))])
    deadline = time.monotonic() + 30
    while remote.batched_contains(keys) < len(keys) or any(remote.exists_in_put_tasks(k) for k in keys):
        assert time.monotonic() < deadline, "the put never landed"
        time.sleep(0.02)


def _objects(server, tenant, bucket: str) -> list[str]:
    return [o["Key"] for o in boto_client(server.endpoint, tenant).list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_two_tenants_storing_the_identical_chunk_never_see_each_others(pair, server, tenants):
    carol, dave = pair
    key = _key(0xC0FFEE)
    _put(carol, [key], seed=1)
    remote_d = dave["RemoteBackend-objectcache"]
    assert remote_d.batched_contains([key]) == 0 and not remote_d.contains(key)
    assert remote_d.get_blocking(key) is None
    assert len(_objects(server, tenants["carol"], "lmc-carol")) == 1
    assert _objects(server, tenants["dave"], "lmc-dave") == []
    # Dave naming Carol's bucket gets AccessDenied, not her chunks (nor whether she has them).
    from client_sdk.sync import SyncObjectCacheClient
    from protocol.errors import ErrorCode, S3Error

    with SyncObjectCacheClient(server.endpoint, tenants["dave"].access_key, tenants["dave"].secret_key, "lmc-carol") as sdk:
        with pytest.raises(S3Error) as e:
            sdk.lookup(_objects(server, tenants["carol"], "lmc-carol"))
        assert e.value.code == ErrorCode.AccessDenied


def test_salts_as_lmcache_tags_never_share_an_object(pair, server, tenants):
    carol, _ = pair
    remote = carol["RemoteBackend-objectcache"]
    salted = _key(0x5A17, {"cache_salt": "tenant-a"})
    before = set(_objects(server, tenants["carol"], "lmc-carol"))
    _put(carol, [salted], seed=2)
    assert remote.batched_contains([salted]) == 1
    for other in (_key(0x5A17, {"cache_salt": "tenant-b"}), _key(0x5A17), _key(0x5A17, {"cache_salt": "tenant-a", "x": "1"})):
        assert remote.batched_contains([other]) == 0, other.to_string()
        assert remote.get_blocking(other) is None
    assert len(set(_objects(server, tenants["carol"], "lmc-carol")) - before) == 1


def test_tag_values_holding_lmcache_separators_do_not_collide(pair):
    """LMCache's to_string joins tags with '@' and '%' unescaped: these two name the same string there."""
    carol, _ = pair
    remote = carol["RemoteBackend-objectcache"]
    one_tag = _key(0x7A6, {"cache_salt": "x@y%z"})
    two_tags = _key(0x7A6, {"cache_salt": "x", "y": "z"})
    assert one_tag.to_string() == two_tags.to_string()  # the ambiguity the plugin must not inherit
    _put(carol, [one_tag], seed=3)
    assert remote.batched_contains([one_tag]) == 1
    assert remote.batched_contains([two_tags]) == 0 and remote.get_blocking(two_tags) is None


def test_another_model_dtype_world_size_or_worker_never_hits(pair):
    import torch

    carol, _ = pair
    remote = carol["RemoteBackend-objectcache"]
    _put(carol, [_key(0x30DE1)], seed=4)
    for other in (_key(0x30DE1, model="other"), _key(0x30DE1, dtype=torch.float16), _key(0x30DE1, world=2), _key(0x30DE1, worker=1)):
        assert remote.batched_contains([other]) == 0, other.to_string()
