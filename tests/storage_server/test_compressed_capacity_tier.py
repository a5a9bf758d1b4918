"""The capacity tier with compressed chunks: the upstream holds (and the link carries) the compressed objects,
the node that fetches them cold decodes them into raw layers."""

from __future__ import annotations

import re

import numpy as np
import pytest
from compressionsupport import kv_chunks, kv_layout
from kvsupport import client, keys_for, reference, run
from support import ServerProcess, boto_client, make_tenants
from upstream import MotoServer


def _node_config(root, name: str, moto: MotoServer, tenants) -> str:
    text = (f'[store]\nbackend = "s3"\ndata_dir = "{root / (name + "-data")}"\n{moto.config()}'
            f'[cache]\nfetch_concurrency = 4\n[storage_server]\nsocket = "{root / name}.sock"\n')
    text += "".join(f'[[tenants]]\nname = "{t.name}"\naccess_key = "{t.access_key}"\nsecret_key = "{t.secret_key}"\n' for t in tenants)
    (root / f"{name}.toml").write_text(text)
    return root / f"{name}.toml"


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    root = tmp_path_factory.mktemp("ztier")
    moto = MotoServer(root / "moto.log").start()
    people = make_tenants("alice")
    nodes = [ServerProcess(_node_config(root, name, moto, people)).start() for name in ("a", "b")]
    yield moto, nodes[0], nodes[1], people[0]
    for n in nodes:
        n.stop()
    moto.stop()


@pytest.mark.parametrize("transport", ["shm", "http"])
def test_a_cold_node_fetches_compressed_chunks_from_the_upstream_and_delivers_raw_layers(tier, transport):
    moto, a, b, alice = tier
    bucket = f"ztier-{transport}"
    boto_client(a.endpoint, alice).create_bucket(Bucket=bucket)
    layout = kv_layout(64)
    n = 6
    chunks = kv_chunks(layout, n, seed=11)
    keys = keys_for(layout, n, bucket)

    async def go():
        async with client(a, alice, bucket) as ca:
            await ca.put_chunks(keys, chunks, layout, codec="zstd")
        before = len(moto.requests())
        async with client(b, alice, bucket) as cb:  # B never saw these chunks: every one comes from the upstream
            payload, stats = await cb.fetch(keys, layout, transport, verify=True)
        return payload, stats, moto.requests()[before:]

    payload, stats, requests = run(go())
    assert np.array_equal(payload, reference(layout, chunks))
    gets = [r for r in requests if re.match(rf"GET /{bucket}/(?!\.objectcache)\S+ ", r)]
    assert len(gets) == n
    upstream_bytes = stats.server.paths.get("upstream", 0)
    sizes = [boto_client(a.endpoint, alice).head_object(Bucket=bucket, Key=k)["ContentLength"] for k in keys]
    assert upstream_bytes == sum(sizes) < n * layout.chunk_bytes  # the link carried the compressed bytes
