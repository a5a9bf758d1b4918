"""Probes: /health says the gateway serves, /ready that it can serve everything; neither needs credentials,
and neither hides a bucket that happens to be called ``health`` or ``ready``."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid

import pytest
from aiohttp.test_utils import make_mocked_request
from rawhttp import signed
from support import ServerProcess, boto_client, make_tenants, write_config

from gateway.health import Health
from gateway.storage_rpc import StorageServerClient
from protocol.config import load_config
from storage_server.store import open_object_store


def probe(endpoint: str, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(endpoint + path, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def split(tmp_path):
    """The gateway and the storage server as two processes; yields (gateway, storage server, tenant)."""
    tenant = make_tenants("probe")[0]
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra=f'\n[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\n')
    storage = ServerProcess(config, "storage-server").start()
    gateway = ServerProcess(config, "gateway").start()
    yield gateway, storage, tenant
    gateway.stop()
    storage.stop()


def test_health_and_ready_answer_without_credentials(split):
    gateway, _, _ = split
    assert probe(gateway.endpoint, "/health") == (200, {"status": "ok"})
    assert probe(gateway.endpoint, "/ready") == (200, {"status": "ready"})


def test_ready_turns_503_naming_the_storage_server_when_it_is_down_while_health_stays_200(split):
    gateway, storage, tenant = split
    storage.kill()
    status, body = probe(gateway.endpoint, "/ready")
    assert status == 503 and body["status"] == "unavailable"
    assert [r.split(":")[0] for r in body["reasons"]] == ["storage server"]
    assert probe(gateway.endpoint, "/health") == (200, {"status": "ok"})
    # Plain S3 still works: the gateway is alive, just not ready for KV.
    s3 = boto_client(gateway.endpoint, tenant)
    s3.create_bucket(Bucket=f"alive-{uuid.uuid4().hex[:8]}")


def test_ready_comes_back_when_the_storage_server_does(split):
    gateway, storage, _ = split
    storage.kill()
    assert probe(gateway.endpoint, "/ready")[0] == 503
    again = ServerProcess(storage.config, "storage-server").start()
    try:
        deadline = time.monotonic() + 10
        while probe(gateway.endpoint, "/ready")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert probe(gateway.endpoint, "/ready") == (200, {"status": "ready"})
    finally:
        again.stop()


@pytest.mark.parametrize("name", ["health", "ready"])
def test_a_bucket_named_like_a_probe_is_still_plain_s3(server, tenants, name):
    s3 = boto_client(server.endpoint, tenants["alice"])
    try:
        s3.create_bucket(Bucket=name)
        s3.put_object(Bucket=name, Key="k", Body=b"v")
        # A signed GET /health?list-type=2 and a presigned GET /health/k are S3 requests.
        assert [o["Key"] for o in s3.list_objects_v2(Bucket=name)["Contents"]] == ["k"]
        url = s3.generate_presigned_url("get_object", Params={"Bucket": name, "Key": "k"}, ExpiresIn=60)
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.read() == b"v"
        v4 = boto_client(server.endpoint, tenants["alice"], signature_version="s3v4")
        listing = v4.generate_presigned_url("list_objects", Params={"Bucket": name}, ExpiresIn=60)  # GET /health?...&X-Amz-Signature=...
        with urllib.request.urlopen(listing, timeout=10) as r:
            assert b"<Key>k</Key>" in r.read()
        # A signed GET /health, no query at all (ListObjects v1): the Authorization header makes it S3, not a probe.
        r = signed(server.endpoint, tenants["alice"], "GET", f"/{name}")
        assert r.status == 200 and b"<ListBucketResult" in r.body and b"<Key>k</Key>" in r.body
    finally:
        s3.delete_object(Bucket=name, Key="k")
        s3.delete_bucket(Bucket=name)
    # Unsigned, it is the probe again.
    assert probe(server.endpoint, f"/{name}")[0] == 200


def test_a_draining_gateway_is_not_ready_whatever_its_dependencies_say(tmp_path):
    """SIGTERM sets the drain before the listener closes: a probe answered from then on says so."""
    cfg = load_config(write_config(tmp_path / "c.toml", tmp_path / "data", make_tenants("d")))

    async def ask() -> tuple[int, dict]:
        store = open_object_store(cfg)
        try:
            health = Health(store, StorageServerClient(cfg))
            health.draining = True
            resp = await health.answer(make_mocked_request("GET", "/ready"))
            return resp.status, json.loads(resp.body)
        finally:
            await store.close()

    assert asyncio.run(ask()) == (503, {"status": "unavailable", "reasons": ["draining: the gateway is shutting down"]})
