"""Per-operation hooks: a hook on the app sees each real request once, named by its route, with its final status."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest
from aiohttp import web
from botocore.exceptions import ClientError
from support import TenantKeys, boto_client, make_tenants, write_config

from gateway.middleware import OPERATION_HOOKS, OperationRecord
from gateway.server import build_app
from protocol.config import load_config
from storage_server.store import open_object_store


@pytest.fixture(scope="module")
def hooked(tmp_path_factory):
    """A gateway (no storage server: plain S3 only) on a background loop, with one recording hook; yields (endpoint, tenant, records)."""
    root = tmp_path_factory.mktemp("hooks")
    tenant = make_tenants("hooks")[0]
    cfg = load_config(write_config(root / "c.toml", root / "data", [tenant]))
    records: list[OperationRecord] = []
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[web.AppRunner, str]:
        app = build_app(cfg, open_object_store(cfg))
        app[OPERATION_HOOKS].append(records.append)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"

    runner, endpoint = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    yield endpoint, tenant, records
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _outcome(call) -> tuple[int, str]:
    """(HTTP status, S3 error code or "")."""
    try:
        return call()["ResponseMetadata"]["HTTPStatusCode"], ""
    except ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"]


def test_hook_sees_operation_and_status_of_each_request(hooked):
    endpoint, tenant, records = hooked
    s3 = boto_client(endpoint, tenant)
    stranger = boto_client(endpoint, TenantKeys("nobody", "AKNOTAKEY", "secret"))
    bucket = f"hooks-{uuid.uuid4().hex[:8]}"
    records.clear()
    calls = [
        lambda: s3.create_bucket(Bucket=bucket),
        lambda: s3.put_object(Bucket=bucket, Key="k", Body=b"12345"),
        lambda: s3.get_object(Bucket=bucket, Key="missing"),
        lambda: s3.list_buckets(),
        lambda: stranger.list_buckets(),  # fails authentication, before routing
        lambda: s3.get_bucket_cors(Bucket=bucket),  # authenticated, but no route serves ?cors
    ]
    outcomes = [_outcome(call) for call in calls]
    assert outcomes == [(200, ""), (200, ""), (404, "NoSuchKey"), (200, ""), (403, "InvalidAccessKeyId"), (501, "NotImplemented")]
    assert [(r.operation, r.status) for r in records] == [
        ("CreateBucket", 200), ("PutObject", 200), ("GetObject", 404), ("ListBuckets", 200), ("Unknown", 403), ("Unknown", 501),
    ]
    put = records[1]
    assert put.tenant == tenant.name and put.bytes_in >= 5 and put.duration_s > 0
    assert records[4].tenant is None
    assert len({r.request_id for r in records}) == len(records)


def test_hook_request_id_is_the_response_header(hooked):
    endpoint, tenant, records = hooked
    records.clear()
    meta = boto_client(endpoint, tenant).list_buckets()["ResponseMetadata"]
    assert [r.request_id for r in records] == [meta["RequestId"]]
    assert records[0].bytes_out > 0
