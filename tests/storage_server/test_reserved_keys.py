"""ObjectCache's own records in an upstream bucket (``.objectcache/…``) are refused on every KV path.

A node of the s3 backend over moto's server keeps the bucket's ownership record at
``.objectcache/bucket.json`` inside the bucket. A tenant's kv-lookup must not confirm it, a
kv-get must not serve it as a chunk (nor tell its size), a kv-put must not write it.
"""

from __future__ import annotations

import boto3
import pytest
from kvsupport import client, keys_for, make_chunks, run, tiny_layout
from support import ServerProcess, boto_client, make_tenants
from upstream import KEYS, MotoServer

from client_sdk import KVLayout, ObjectCacheError
from protocol.errors import ErrorCode

MARKER = ".objectcache/bucket.json"
LAYOUT = tiny_layout(16, num_layers=4)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("reserved")
    moto = MotoServer(root / "moto.log").start()
    alice = make_tenants("alice")[0]
    config = root / "node.toml"
    config.write_text(f'[store]\nbackend = "s3"\ndata_dir = "{root / "data"}"\n{moto.config()}'
                      f'[storage_server]\nsocket = "{root / "ss.sock"}"\n'
                      f'[[tenants]]\nname = "alice"\naccess_key = "{alice.access_key}"\nsecret_key = "{alice.secret_key}"\n')
    proc = ServerProcess(config).start()
    boto_client(proc.endpoint, alice).create_bucket(Bucket="mine")
    upstream = boto3.client("s3", endpoint_url=moto.endpoint, aws_access_key_id=KEYS[0], aws_secret_access_key=KEYS[1],
                            region_name="us-east-1")
    marker_size = upstream.head_object(Bucket="mine", Key=MARKER)["ContentLength"]
    yield proc, alice, marker_size
    proc.stop()
    moto.stop()


def _refused(e: pytest.ExceptionInfo, key: str) -> None:
    assert e.value.code is ErrorCode.InvalidArgument and e.value.extra.get("Key") == key, e.value


def test_kv_lookup_does_not_confirm_the_bucket_record(node):
    proc, alice, _ = node
    keys = keys_for(LAYOUT, 2, "lookup")

    async def scenario():
        async with client(proc, alice, "mine") as c:
            await c.put_chunks(keys, make_chunks(LAYOUT, 2, seed=1), LAYOUT)
            assert await c.lookup(keys) == 2  # ordinary chunks still answer
            for asked in ([MARKER], [*keys, MARKER], [".objectcache/uploads/x.json"]):
                with pytest.raises(ObjectCacheError) as e:
                    await c.lookup(asked)
                _refused(e, asked[-1])

    run(scenario())


def test_kv_get_does_not_serve_the_bucket_record(node):
    proc, alice, size = node
    # A layout whose chunk is exactly the record's size when it can be one (2·G·L bytes), so without the
    # refusal the kv-get would hand over the record's bytes; otherwise the record's size would leak instead.
    layout = KVLayout(num_layers=1, chunk_tokens=max(1, size // 2), kv_heads=1, head_dim=1, dtype="uint8")

    async def scenario():
        async with client(proc, alice, "mine") as c:
            for transport in ("http", "shm"):
                with pytest.raises(ObjectCacheError) as e:
                    await c.fetch([MARKER], layout, transport)
                _refused(e, MARKER)
                assert str(size) not in str(e.value.extra.get("ActualSize", ""))

    run(scenario())


def test_kv_put_of_a_reserved_key_is_refused(node):
    proc, alice, _ = node
    layout = tiny_layout(16, num_layers=1)

    async def scenario():
        async with client(proc, alice, "mine") as c:
            with pytest.raises(ObjectCacheError) as e:
                await c.put_chunks([MARKER], make_chunks(layout, 1, seed=2), layout)
            _refused(e, MARKER)
            assert await c.lookup(keys_for(layout, 1, "after")) == 0  # the bucket record still works: the bucket is alice's

    run(scenario())
