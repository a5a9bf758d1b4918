"""Bucket ownership records name a tenant by its owner id, not its name (issue 23 item 9): two nodes over one
upstream whose tenant lists were not shared, each with an ``alice`` of other keys, do not own each other's
buckets; records written before owner ids (the tenant's name) stay the named tenant's."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import pytest
from botocore.exceptions import ClientError
from support import ServerProcess, boto_client, make_tenants, write_config
from upstream import MotoServer, s3_backend_config

from protocol.config import Tenant, load_config
from storage_server.store import open_object_store


def _code(e: pytest.ExceptionInfo) -> str:
    return e.value.response["Error"]["Code"]


def test_owner_ids_differ_by_access_key_only_and_never_use_the_secret():
    a, b = Tenant("alice", "AK1", "s1"), Tenant("alice", "AK2", "s1")
    assert a.owner_id != b.owner_id and a.owner_id.startswith("alice~")
    assert Tenant("alice", "AK1", "other secret").owner_id == a.owner_id
    assert Tenant("alice", "AK9", "s", id="alice~kept").owner_id == "alice~kept"  # pinned across a key rotation


def test_two_nodes_whose_alices_have_other_keys_do_not_share_buckets(tmp_path):
    alice_a, alice_b = (dataclasses.replace(t, name="alice") for t in make_tenants("x", "y"))
    with contextlib.ExitStack() as stack:
        moto = MotoServer(tmp_path / "moto.log").start()
        stack.callback(moto.stop)
        a = ServerProcess(s3_backend_config(tmp_path, moto, [alice_a], name="a")).start()
        stack.callback(a.stop)
        b = ServerProcess(s3_backend_config(tmp_path, moto, [alice_b], name="b")).start()
        stack.callback(b.stop)
        _not_shared(a, b, alice_a, alice_b)


def _not_shared(a: ServerProcess, b: ServerProcess, alice_a, alice_b) -> None:
    """Node B's alice (other keys) neither reads, writes, lists nor re-creates node A's alice's bucket."""
    s3a, s3b = boto_client(a.endpoint, alice_a), boto_client(b.endpoint, alice_b)
    s3a.create_bucket(Bucket="alices-on-a")
    s3a.put_object(Bucket="alices-on-a", Key="secret", Body=b"a's")
    for call in (lambda: s3b.get_object(Bucket="alices-on-a", Key="secret"), lambda: s3b.head_bucket(Bucket="alices-on-a"),
                 lambda: s3b.put_object(Bucket="alices-on-a", Key="x", Body=b"b"), lambda: s3b.list_objects_v2(Bucket="alices-on-a")):
        with pytest.raises(ClientError) as e:
            call()
        assert _code(e) in ("AccessDenied", "403"), e.value.response
    with pytest.raises(ClientError) as e:
        s3b.create_bucket(Bucket="alices-on-a")
    assert _code(e) == "BucketAlreadyExists"
    assert [x["Name"] for x in s3b.list_buckets()["Buckets"]] == []
    # Node A's alice still owns it.
    assert [x["Name"] for x in s3a.list_buckets()["Buckets"]] == ["alices-on-a"]
    assert s3a.get_object(Bucket="alices-on-a", Key="secret")["Body"].read() == b"a's"


def test_a_bucket_recorded_under_a_tenant_name_stays_that_tenants(tmp_path):
    alice, bob = make_tenants("alice", "bob")
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [alice, bob])

    async def legacy_record() -> None:  # as a store written before owner ids recorded it
        store = open_object_store(load_config(config, env={}))
        try:
            await store.create_bucket("old-bucket", "alice", "us-east-1")
        finally:
            await store.close()

    asyncio.run(legacy_record())
    node = ServerProcess(config).start()
    try:
        s3, s3_bob = boto_client(node.endpoint, alice), boto_client(node.endpoint, bob)
        s3.put_object(Bucket="old-bucket", Key="k", Body=b"v")
        assert s3.get_object(Bucket="old-bucket", Key="k")["Body"].read() == b"v"
        s3.create_bucket(Bucket="new-bucket")
        assert [x["Name"] for x in s3.list_buckets()["Buckets"]] == ["new-bucket", "old-bucket"]
        s3.create_bucket(Bucket="old-bucket")  # us-east-1: re-creating one's own bucket succeeds
        with pytest.raises(ClientError) as e:
            s3_bob.get_object(Bucket="old-bucket", Key="k")
        assert _code(e) == "AccessDenied"
        assert s3_bob.list_buckets()["Buckets"] == []
    finally:
        node.stop()
