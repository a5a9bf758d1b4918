"""A chunk deleted or replaced through one node stops being served from another node's cache within ``cache.revalidate_after_s``.

moto's server and two nodes: A writes, B reads. B's bound is 0 (checked at every
kv-get), so the test needs no clock: after A deletes the chunks and puts other bytes
under the same keys, B's next kv-get serves the new bytes; after A deletes them for
good, B's next kv-get answers NoSuchKey.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from kvsupport import client, keys_for, make_chunks, reference, rpc, run, tiny_layout
from support import ServerProcess, TenantKeys, boto_client, make_tenants
from upstream import MotoServer, s3_backend_config

LAYOUT = tiny_layout(16, num_layers=8)
N = 6


def node_config(root: Path, name: str, moto: MotoServer, tenants: list[TenantKeys], revalidate_after_s: float | None) -> Path:
    bound = "" if revalidate_after_s is None else f"revalidate_after_s = {revalidate_after_s}\n"
    return s3_backend_config(root, moto, tenants, name, extra=f"[cache]\nfetch_concurrency = 4\n{bound}")


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    root = tmp_path_factory.mktemp("stale")
    moto = MotoServer(root / "moto.log").start()
    alice = make_tenants("alice")[0]
    a = ServerProcess(node_config(root, "a", moto, [alice], None)).start()
    b = ServerProcess(node_config(root, "b", moto, [alice], 0)).start()
    yield moto, a, b, alice, root
    a.stop()
    b.stop()
    moto.stop()


async def _put(node, tenant, bucket, keys, chunks) -> None:
    async with client(node, tenant, bucket) as c:
        assert await c.put_chunks(keys, chunks, LAYOUT) == len(keys)


async def _fetch(node, tenant, bucket, keys) -> np.ndarray:
    async with client(node, tenant, bucket) as c:
        return (await c.fetch(keys, LAYOUT, "http", mode="layerwise"))[0]


def test_a_chunk_replaced_or_deleted_through_another_node_is_not_served_from_the_cache(tier):
    moto, a, b, alice, root = tier
    bucket = "replaced"
    s3_a = boto_client(a.endpoint, alice)
    s3_a.create_bucket(Bucket=bucket)
    keys = keys_for(LAYOUT, N, bucket)
    old, new = make_chunks(LAYOUT, N, seed=1), make_chunks(LAYOUT, N, seed=2)
    run(_put(a, alice, bucket, keys, old))
    assert np.array_equal(run(_fetch(b, alice, bucket, keys)), reference(LAYOUT, old))  # now in B's cache
    before = len(moto.requests())
    assert np.array_equal(run(_fetch(b, alice, bucket, keys)), reference(LAYOUT, old))
    # Unchanged: confirmed with HEADs, no chunk fetched again.
    assert [r for r in moto.requests()[before:] if re.match(rf"GET /{bucket}/(?!\.objectcache)", r)] == []
    s3_a.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})
    run(_put(a, alice, bucket, keys, new))
    assert np.array_equal(run(_fetch(b, alice, bucket, keys)), reference(LAYOUT, new))
    s3_a.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})
    with pytest.raises(Exception, match="NoSuchKey"):
        run(_fetch(b, alice, bucket, keys))
    assert rpc(str(root / "b.sock"), "status")["chunk_cache"]["chunks"] == 0


def test_a_node_with_the_default_bound_serves_warm_chunks_without_asking_the_upstream_about_them(tier):
    moto, a, _, alice, _ = tier
    bucket = "warm"
    boto_client(a.endpoint, alice).create_bucket(Bucket=bucket)
    keys, chunks = keys_for(LAYOUT, N, bucket), make_chunks(LAYOUT, N, seed=3)
    run(_put(a, alice, bucket, keys, chunks))
    before = len(moto.requests())
    assert np.array_equal(run(_fetch(a, alice, bucket, keys)), reference(LAYOUT, chunks))
    assert [r for r in moto.requests()[before:] if re.match(rf"(GET|HEAD) /{bucket}/(?!\.objectcache)", r)] == []
