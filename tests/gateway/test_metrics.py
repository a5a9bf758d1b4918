"""Prometheus metrics: each process serves its own /metrics, and the numbers move by exactly what was done."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
import uuid

import pytest
from botocore.exceptions import ClientError
from kvsupport import client, keys_for, make_chunks, put_and_fetch, run, tiny_layout
from metricsupport import scrape, value
from support import REPO, ServerProcess, boto_client, free_port, make_tenants, write_config


@pytest.fixture(scope="module")
def metered(tmp_path_factory):
    """``objectcache serve`` with both metrics listeners and a bandwidth pool; yields (server, tenant, gateway port, storage port)."""
    root = tmp_path_factory.mktemp("metrics")
    tenant = make_tenants("metered")[0]
    gw_port, ss_port = free_port(), free_port()
    config = write_config(root / "c.toml", root / "data", [tenant], extra=(
        f'\n[storage_server]\nsocket = "{root / "ss.sock"}"\n'
        f'\n[bandwidth]\ncapacity_gbps = 80\n'
        f'\n[metrics]\ngateway_port = {gw_port}\nstorage_server_port = {ss_port}\n'))
    proc = ServerProcess(config).start()
    yield proc, tenant, gw_port, ss_port
    proc.stop()


def test_gateway_counts_each_operation_by_status_with_latency_and_bytes(metered):
    server, tenant, gw_port, _ = metered
    s3 = boto_client(server.endpoint, tenant)
    bucket = f"m-{uuid.uuid4().hex[:8]}"
    before = scrape(gw_port)
    s3.create_bucket(Bucket=bucket)
    for i in range(3):
        s3.put_object(Bucket=bucket, Key=f"k{i}", Body=b"x" * 1000)
    assert s3.get_object(Bucket=bucket, Key="k0")["Body"].read() == b"x" * 1000
    with pytest.raises(ClientError):
        s3.get_object(Bucket=bucket, Key="missing")
    urllib.request.urlopen(server.endpoint + "/health", timeout=10).read()
    after = scrape(gw_port)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("objectcache_requests_total", operation="CreateBucket", status="200") == 1
    assert delta("objectcache_requests_total", operation="PutObject", status="200") == 3
    assert delta("objectcache_requests_total", operation="GetObject", status="200") == 1
    assert delta("objectcache_requests_total", operation="GetObject", status="404") == 1
    assert delta("objectcache_requests_total", operation="Health", status="200") == 1
    assert delta("objectcache_request_duration_seconds_count", operation="PutObject") == 3
    assert delta("objectcache_request_duration_seconds_sum", operation="PutObject") > 0
    assert delta("objectcache_request_bytes_total", operation="PutObject") == 3000
    assert delta("objectcache_response_bytes_total", operation="GetObject") >= 1000
    assert value(after, "objectcache_gateway_draining") == 0
    # prometheus_client's process collectors come along.
    assert value(after, "process_resident_memory_bytes") > 0 and value(after, "process_open_fds") > 0


def test_storage_server_counts_kv_gets_by_mode_and_transport_with_bytes_and_timings(metered):
    server, tenant, gw_port, ss_port = metered
    bucket = f"kv-{uuid.uuid4().hex[:8]}"
    boto_client(server.endpoint, tenant).create_bucket(Bucket=bucket)
    layout = tiny_layout(16)
    keys, chunks = keys_for(layout, 8, bucket), make_chunks(layout, 8, seed=1)
    payload = 8 * layout.chunk_bytes
    before, gw_before = scrape(ss_port), scrape(gw_port)
    regions_meanwhile: list[float] = []

    async def work():
        async with client(server, tenant, bucket) as c:
            assert await c.put_chunks(keys, chunks, layout) == 8
            await c.fetch(keys, layout, transport="http", mode="chunkwise")
            await c.fetch(keys, layout, transport="http", mode="layerwise")
            await c.fetch(keys, layout, transport="shm", mode="layerwise")
            regions_meanwhile.append(value(scrape(ss_port), "objectcache_kv_regions"))

    run(work())
    after, gw_after = scrape(ss_port), scrape(gw_port)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("objectcache_kv_gets_total", mode="chunkwise", transport="http", outcome="ok") == 1
    assert delta("objectcache_kv_gets_total", mode="layerwise", transport="http", outcome="ok") == 1
    assert delta("objectcache_kv_gets_total", mode="layerwise", transport="shm", outcome="ok") == 1
    for mode, transport in (("chunkwise", "http"), ("layerwise", "http"), ("layerwise", "shm")):
        assert delta("objectcache_kv_get_payload_bytes_total", mode=mode, transport=transport) == payload
        assert delta("objectcache_kv_get_first_layer_seconds_count", mode=mode, transport=transport) == 1
        assert delta("objectcache_kv_get_first_layer_seconds_sum", mode=mode, transport=transport) > 0
        assert delta("objectcache_kv_get_layer_delivery_seconds_count", mode=mode, transport=transport) == 1
    # The shm client's region is registered while it is open, and gone once it closed.
    assert regions_meanwhile == [1] and value(after, "objectcache_kv_regions") == 0
    assert value(after, "objectcache_kv_transfers_active", mode="layerwise") == 0
    assert value(after, "objectcache_kv_staging_held_bytes") == 0
    assert value(after, "objectcache_kv_staging_limit_bytes") == 1 << 30
    assert value(after, "objectcache_bandwidth_capacity_bytes_per_second") == 80e9 / 8
    assert value(after, "process_resident_memory_bytes") > 0
    # The gateway saw the two http kv-gets as operations; the shm one took the local fast path (the SDK's default:
    # its session socket reaches the storage server without the gateway), which the storage server counted above.
    assert value(gw_after, "objectcache_requests_total", operation="KVGet", status="200") - \
        value(gw_before, "objectcache_requests_total", operation="KVGet", status="200") == 2
    assert value(gw_after, "objectcache_requests_total", operation="KVPut", status="200") - \
        value(gw_before, "objectcache_requests_total", operation="KVPut", status="200") >= 1


def test_no_metrics_listener_unless_configured(server):
    """The session's server configures none: the S3 port does not serve /metrics either (it is S3: a bucket named metrics)."""
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server.endpoint + "/metrics", timeout=10)
    assert e.value.code == 403


def test_every_series_the_grafana_dashboard_queries_is_exported(metered):
    server, tenant, gw_port, ss_port = metered
    put_and_fetch(server, tenant, f"dash-{uuid.uuid4().hex[:8]}", 2, transport="http")
    exported = {name for name, _ in scrape(gw_port)} | {name for name, _ in scrape(ss_port)}
    dashboard = json.loads((REPO / "deploy" / "grafana" / "objectcache.json").read_text())
    queried = {name for p in dashboard["panels"] for t in p["targets"] for name in re.findall(r"\b((?:objectcache|process)_[a-z_]+)\{", t["expr"])}
    assert queried and queried - exported == set()
