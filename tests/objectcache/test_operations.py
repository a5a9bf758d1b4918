"""What an operator relies on: access logs that join across processes, no secrets in any log,
graceful drain on SIGTERM, systemd readiness notifications, and unit files systemd accepts."""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
import tomllib
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
from botocore.exceptions import ClientError
from kvsupport import client, keys_for, make_chunks, put_and_fetch, run, tiny_layout
from metricsupport import scrape, value
from support import REPO, ServerProcess, TenantKeys, boto_client, free_port, make_tenants, write_config

from client_sdk import ObjectCacheError
from protocol.errors import ErrorCode


def json_lines(proc: ServerProcess) -> list[dict]:
    out = []
    for line in list(proc.output):
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def wait_for_lines(proc: ServerProcess, match, count: int = 1, timeout: float = 10) -> list[dict]:
    """The JSON log lines ``match`` accepts, once at least ``count`` arrived (the output is read by a thread)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [r for r in json_lines(proc) if match(r)]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """``objectcache serve`` logging JSON; yields (server, tenant)."""
    root = tmp_path_factory.mktemp("logs")
    tenant = make_tenants("logged")[0]
    config = write_config(root / "c.toml", root / "data", [tenant],
                          extra=f'\n[storage_server]\nsocket = "{root / "ss.sock"}"\n\n[log]\nformat = "json"\n')
    proc = ServerProcess(config).start()
    yield proc, tenant
    proc.stop()


def test_one_access_line_per_request_with_its_id_tenant_operation_bucket_status_bytes_and_duration(logged):
    server, tenant = logged
    s3 = boto_client(server.endpoint, tenant)
    bucket = f"log-{uuid.uuid4().hex[:8]}"
    ids = {
        "CreateBucket": s3.create_bucket(Bucket=bucket)["ResponseMetadata"]["RequestId"],
        "PutObject": s3.put_object(Bucket=bucket, Key="k", Body=b"y" * 777)["ResponseMetadata"]["RequestId"],
    }
    got = s3.get_object(Bucket=bucket, Key="k")
    assert got["Body"].read() == b"y" * 777
    ids["GetObject"] = got["ResponseMetadata"]["RequestId"]
    for operation, rid in ids.items():
        lines = wait_for_lines(server, lambda r, rid=rid: r.get("logger") == "objectcache.access" and r.get("request_id") == rid)
        assert len(lines) == 1, f"{operation}: {lines}"
        line = lines[0]
        assert (line["operation"], line["tenant"], line["bucket"], line["status"]) == (operation, "logged", bucket, 200)
        assert line["duration_s"] >= 0 and line["level"] == "INFO"
    put = wait_for_lines(server, lambda r: r.get("request_id") == ids["PutObject"])[0]
    get = wait_for_lines(server, lambda r: r.get("request_id") == ids["GetObject"])[0]
    assert put["bytes_in"] == 777 and get["bytes_out"] >= 777



def test_a_request_refused_before_routing_is_logged_too(logged):
    server, _ = logged
    stranger = boto_client(server.endpoint, TenantKeys("nobody", "AKNOTAKEY", "not-a-secret"))
    with pytest.raises(ClientError) as e:
        stranger.list_buckets()
    rid = e.value.response["ResponseMetadata"]["RequestId"]
    [line] = wait_for_lines(server, lambda r: r.get("logger") == "objectcache.access" and r.get("request_id") == rid)
    assert (line["operation"], line["tenant"], line["status"]) == ("Unknown", None, 403)


def test_a_kv_get_has_the_same_request_id_in_the_gateway_line_the_storage_server_line_and_the_end_frame(logged):
    server, tenant = logged
    bucket = f"kvlog-{uuid.uuid4().hex[:8]}"
    _, stats = put_and_fetch(server, tenant, bucket, 4, seed=2, transport="http", mode="layerwise")
    layout = tiny_layout(16)
    rid = stats.request_id
    assert rid and stats.server.request_id == rid  # the END frame
    transfer = wait_for_lines(server, lambda r: r.get("logger") == "objectcache.access.transfers" and r.get("request_id") == rid)
    assert len(transfer) == 1
    assert {k: transfer[0][k] for k in ("tenant", "bucket", "mode", "transport", "outcome", "bytes")} == \
        {"tenant": "logged", "bucket": bucket, "mode": "layerwise", "transport": "http", "outcome": "ok", "bytes": 4 * layout.chunk_bytes}
    assert transfer[0]["seconds"] > 0
    gateway = wait_for_lines(server, lambda r: r.get("logger") == "objectcache.access" and r.get("request_id") == rid)
    assert [(g["operation"], g["status"]) for g in gateway] == [("KVGet", 200)]


def test_no_log_line_carries_a_secret_or_a_signature(logged):
    server, tenant = logged
    s3 = boto_client(server.endpoint, tenant)
    s3.list_buckets()
    wait_for_lines(server, lambda r: r.get("operation") == "ListBuckets")
    everything = "".join(server.output)
    assert tenant.secret_key not in everything
    assert "Signature" not in everything and "Authorization" not in everything and "AWS4-HMAC-SHA256" not in everything


def test_text_format_access_lines_are_json_objects_after_the_prefix(tmp_path):
    tenant = make_tenants("text")[0]
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra='\n[log]\nformat = "text"\n')
    gateway = ServerProcess(config, "gateway").start()
    try:
        rid = boto_client(gateway.endpoint, tenant).list_buckets()["ResponseMetadata"]["RequestId"]
        deadline = time.monotonic() + 10
        while not [line for line in gateway.output if rid in line] and time.monotonic() < deadline:
            time.sleep(0.05)
        line = next(line for line in gateway.output if rid in line)
        assert " objectcache.access INFO " in line
        assert json.loads(line.split(" INFO ", 1)[1])["operation"] == "ListBuckets"
    finally:
        gateway.stop()


# -- graceful drain ---------------------------------------------------------------------

@pytest.fixture
def gateway_alone(tmp_path):
    """A gateway process (plain S3 needs no storage server) with a 48 MiB object; yields (gateway, tenant, presigned URL, body)."""
    def start(drain_timeout_s: float = 30, env: dict[str, str] | None = None, metrics_port: int = 0):
        tenant = make_tenants("drain")[0]
        config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant],
                              extra=f"\n[gateway]\ndrain_timeout_s = {drain_timeout_s}\n\n[metrics]\ngateway_port = {metrics_port}\n")
        gateway = ServerProcess(config, "gateway", env=env).start()
        started.append(gateway)
        s3 = boto_client(gateway.endpoint, tenant)
        s3.create_bucket(Bucket="drain")
        body = secrets.token_bytes(1 << 20) * 48
        s3.put_object(Bucket="drain", Key="big", Body=body)
        return gateway, s3.generate_presigned_url("get_object", Params={"Bucket": "drain", "Key": "big"}, ExpiresIn=300), body

    started: list[ServerProcess] = []
    yield start
    for g in started:
        g.stop()


def open_get(url: str) -> http.client.HTTPResponse:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("GET", f"{u.path}?{u.query}")
    return conn.getresponse()


def refuses_connections(endpoint: str, timeout: float = 10) -> bool:
    u = urlsplit(endpoint)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((u.hostname, u.port), timeout=1).close()
        except ConnectionRefusedError:
            return True
        time.sleep(0.05)
    return False


def test_sigterm_lets_a_long_get_finish_and_refuses_new_connections(gateway_alone):
    metrics_port = free_port()
    gateway, url, body = gateway_alone(metrics_port=metrics_port)
    assert value(scrape(metrics_port), "objectcache_gateway_draining") == 0
    resp = open_get(url)
    assert resp.status == 200
    head = resp.read(1 << 20)  # the rest waits in the gateway: the request is in flight
    gateway.proc.send_signal(signal.SIGTERM)
    assert refuses_connections(gateway.endpoint)
    assert gateway.proc.poll() is None  # still serving the GET
    assert value(scrape(metrics_port), "objectcache_gateway_draining") == 1  # and unready (/ready answers 503 from now on)
    assert head + resp.read() == body
    assert gateway.proc.wait(timeout=30) == 0


def test_a_request_longer_than_the_drain_timeout_is_cut_and_the_gateway_exits(gateway_alone):
    gateway, url, body = gateway_alone(drain_timeout_s=1)
    resp = open_get(url)
    resp.read(1 << 20)
    gateway.proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert gateway.proc.wait(timeout=30) == 0
    assert time.monotonic() - started < 15
    with pytest.raises((http.client.IncompleteRead, ConnectionError)):
        resp.read()


def test_the_gateway_tells_systemd_it_is_ready_and_then_stopping(gateway_alone):
    name = f"@objectcache-test-{uuid.uuid4().hex}"  # an abstract socket, as systemd may hand out
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name[1:])
        sock.settimeout(10)
        gateway, _, _ = gateway_alone(env={"NOTIFY_SOCKET": name})
        assert sock.recv(256) == b"READY=1"
        gateway.proc.send_signal(signal.SIGTERM)
        assert sock.recv(256) == b"STOPPING=1"
        assert gateway.proc.wait(timeout=30) == 0


# -- unit files ------------------------------------------------------------------------------

UNITS = sorted((REPO / "deploy" / "systemd").glob("*.service"))


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_systemd_accepts_the_unit(unit: Path, tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    # The unit's ExecStart names the installed command; point it at one that exists here.
    fake = tmp_path / "objectcache"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    copy = tmp_path / unit.name
    copy.write_text(unit.read_text().replace("/opt/objectcache/.venv/bin/objectcache", str(fake)))
    for other in UNITS:  # units it names must be found beside it
        if other != unit:
            (tmp_path / other.name).write_text(other.read_text().replace("/opt/objectcache/.venv/bin/objectcache", str(fake)))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"})
    problems = [line for line in (r.stdout + r.stderr).splitlines() if unit.name in line or "objectcache" in line]
    if r.returncode != 0 and not problems:
        pytest.skip(f"systemd-analyze cannot verify here: {(r.stdout + r.stderr).strip()[:300]}")
    assert r.returncode == 0 and problems == [], r.stdout + r.stderr


def test_units_wait_for_the_network_notify_readiness_and_are_hardened():
    for unit in UNITS:
        text = unit.read_text()
        for line in ("Wants=network-online.target", "Type=notify", "Restart=on-failure", "StateDirectory=objectcache",
                     "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes"):
            assert line in text, f"{unit.name}: {line}"
        assert "After=network-online.target" in text.replace(" objectcache-storage-server.service", "")


def paced_kv_get_across_sigterm(tmp_path, drain_timeout_s: float, transport: str):
    """A kv-get paced to about 2.5 s by a 10 Mbit/s pool, the storage server SIGTERMed once its first layer arrived;
    (payload or the client's error, the storage server's exit code, its output)."""
    tenant = make_tenants("slow")[0]
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra=(
        f'\n[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\ndrain_timeout_s = {drain_timeout_s}\n'
        '\n[bandwidth]\ncapacity_gbps = 0.01\nmargin_gbps = 0\n'))
    storage = ServerProcess(config, "storage-server").start()
    gateway = ServerProcess(config, "gateway").start()
    try:
        boto_client(gateway.endpoint, tenant).create_bucket(Bucket="slow")
        layout = tiny_layout(16)
        n = 3000  # 3 MB at 1.25 MB/s
        keys = keys_for(layout, n, "slow")

        async def fetch_during_sigterm():
            async with client(gateway, tenant, "slow") as c:
                await c.put_chunks(keys, make_chunks(layout, n, seed=9), layout)
                try:
                    async with c.fetch_layers(keys, layout, transport, mode="layerwise") as layers:
                        ready = aiter(layers)
                        await anext(ready)  # the transfer is in flight: its first layer is here, 15 still paced
                        storage.proc.send_signal(signal.SIGTERM)
                        assert len([i async for i, _ in ready]) == layout.num_layers - 1
                        return np.frombuffer(layers.payload, np.uint8).copy()
                except ObjectCacheError as e:
                    return e

        outcome = run(fetch_during_sigterm())
        return outcome, storage.proc.wait(timeout=30), "".join(storage.output)
    finally:
        gateway.stop()
        storage.stop()


@pytest.mark.parametrize("transport", ["http", "shm"])
def test_sigterm_lets_the_storage_server_finish_a_transfer_in_flight(tmp_path, transport):
    data, code, _ = paced_kv_get_across_sigterm(tmp_path, 30, transport)
    assert not isinstance(data, Exception), data
    assert data.size == 3000 * tiny_layout(16).chunk_bytes and code == 0


@pytest.mark.parametrize("transport", ["http", "shm"])
def test_past_its_drain_timeout_the_storage_server_cuts_the_transfer_cleanly_and_exits(tmp_path, transport):
    """The client is told the storage server stopped (not a corrupt stream), and the daemon stops without a traceback.
    Over http the gateway says so in an ERROR frame; over shm the local fast path's stream ends before END, which the
    SDK reports."""
    error, code, output = paced_kv_get_across_sigterm(tmp_path, 0, transport)
    assert isinstance(error, ObjectCacheError) and error.code is ErrorCode.ServiceUnavailable
    assert "storage server stopped in the middle" in str(error) or "storage server may have stopped" in str(error)
    assert code == 0
    assert "drain timeout: stopping 1 transfer(s)" in output
    assert "Traceback" not in output and "Task was destroyed" not in output


def test_the_image_copies_every_package_runs_as_a_user_and_checks_health():
    """No Docker daemon in the test environment: check what a build would miss."""
    dockerfile = (REPO / "Dockerfile").read_text()
    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    copied = set(re.findall(r"^COPY (\w+) \1$", dockerfile, re.M))
    assert {pattern.rstrip("*") for pattern in include} <= copied
    assert re.search(r"^USER objectcache$", dockerfile, re.M)
    assert re.search(r"^HEALTHCHECK .*http://127\.0\.0\.1:9000/health", dockerfile, re.M | re.S)


def test_serve_says_ready_once_for_both_processes(tmp_path):
    """Under ``serve`` the unit's main process speaks for both children; they never notify themselves."""
    tenant = make_tenants("both")[0]
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra=f'\n[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\n')
    name = f"@objectcache-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name[1:])
        sock.settimeout(10)
        server = ServerProcess(config, env={"NOTIFY_SOCKET": name}).start()
        try:
            assert sock.recv(256) == b"READY=1"
            sock.settimeout(0.5)
            with pytest.raises(TimeoutError):
                sock.recv(256)  # nothing from the gateway or the storage server
        finally:
            server.proc.send_signal(signal.SIGTERM)
            sock.settimeout(10)
            assert sock.recv(256) == b"STOPPING=1"
            assert server.proc.wait(timeout=30) == 0
