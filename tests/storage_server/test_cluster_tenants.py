"""Tenants of a cluster (issue 23 item 9): one shared definition, and no node's generated dev tenant
owns what another node's tenant created."""

from __future__ import annotations

from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from support import ServerProcess, TenantKeys, boto_client, make_tenants
from upstream import MotoServer


def _node(root: Path, name: str, moto: MotoServer, extra: str = "") -> Path:
    text = (f'{extra}[store]\nbackend = "s3"\ndata_dir = "{root / (name + "-data")}"\n{moto.config()}'
            f'[storage_server]\nsocket = "{root / name}.sock"\n')
    (root / f"{name}.toml").write_text(text)
    return root / f"{name}.toml"


def _dev(node: ServerProcess) -> TenantKeys:
    text = "".join(node.output)
    return TenantKeys("dev", text.split("access key:")[1].split()[0], text.split("secret key:")[1].split()[0])


def _code(e: pytest.ExceptionInfo) -> str:
    return e.value.response["Error"]["Code"]


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log").start()
    yield server
    server.stop()


def test_another_nodes_generated_dev_tenant_does_not_own_this_nodes_buckets(tmp_path, moto):
    a = ServerProcess(_node(tmp_path, "a", moto)).start()
    b = ServerProcess(_node(tmp_path, "b", moto)).start()
    try:
        s3a, s3b = boto_client(a.endpoint, _dev(a)), boto_client(b.endpoint, _dev(b))
        s3a.create_bucket(Bucket="made-on-a")
        s3a.put_object(Bucket="made-on-a", Key="secret", Body=b"node a's")
        with pytest.raises(ClientError) as e:
            s3b.get_object(Bucket="made-on-a", Key="secret")
        assert _code(e) == "AccessDenied"
        with pytest.raises(ClientError) as e:
            s3b.create_bucket(Bucket="made-on-a")
        assert _code(e) == "BucketAlreadyExists"
        assert "made-on-a" not in [x["Name"] for x in s3b.list_buckets()["Buckets"]]
        # Node A's own dev tenant still owns it, through A.
        assert s3a.get_object(Bucket="made-on-a", Key="secret")["Body"].read() == b"node a's"
    finally:
        a.stop()
        b.stop()


def test_nodes_reading_one_tenants_file_share_their_tenants(tmp_path, moto):
    alice = make_tenants("alice")[0]
    shared = tmp_path / "tenants.toml"
    shared.write_text(f'[[tenants]]\nname = "alice"\naccess_key = "{alice.access_key}"\nsecret_key = "{alice.secret_key}"\n')
    a = ServerProcess(_node(tmp_path, "a", moto, extra=f'tenants_file = "{shared}"\n')).start()
    b = ServerProcess(_node(tmp_path, "b", moto), env={"OBJECTCACHE_TENANTS_FILE": str(shared)}).start()
    try:
        assert "tenants:        alice" in "".join(a.output) and "tenants:        alice" in "".join(b.output)
        boto_client(a.endpoint, alice).create_bucket(Bucket="alices")
        boto_client(a.endpoint, alice).put_object(Bucket="alices", Key="k", Body=b"v")
        assert boto_client(b.endpoint, alice).get_object(Bucket="alices", Key="k")["Body"].read() == b"v"
    finally:
        a.stop()
        b.stop()
