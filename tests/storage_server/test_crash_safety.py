"""Acknowledged writes survive a crash; unacknowledged ones are absent or whole, never torn."""

from __future__ import annotations

import hashlib
import http.client
import random
import threading
import time
from urllib.parse import urlsplit

import pytest
from botocore.exceptions import ClientError

from rawhttp import sign
from support import ServerProcess, boto_client, make_tenants, write_config

MiB = 1024 * 1024


def content(key: str, size: int) -> bytes:
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


@pytest.fixture
def crashable(tmp_path):
    tenant = make_tenants("crash")[0]
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant])
    proc = ServerProcess(config).start()
    yield proc, tenant
    if proc.proc and proc.proc.poll() is None:
        proc.stop()


def start_slow_put(endpoint: str, tenant, bucket: str, key: str, total: int, sent_first: threading.Event) -> threading.Thread:
    """PUT ``total`` bytes, sending the first MiB and then trickling, so the server is killed mid-body."""

    def run() -> None:
        u = urlsplit(endpoint)
        headers = sign(tenant, "PUT", f"{endpoint}/{bucket}/{key}", payload_hash="UNSIGNED-PAYLOAD")
        headers["Content-Length"] = str(total)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        try:
            conn.putrequest("PUT", f"/{bucket}/{key}", skip_host=True, skip_accept_encoding=True)
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.endheaders()
            data = content(key, total)
            conn.send(data[:MiB])
            sent_first.set()
            for i in range(MiB, total, 64 * 1024):
                conn.send(data[i : i + 64 * 1024])
                time.sleep(0.01)
            conn.getresponse().read()
        except OSError:
            pass  # the server died under us: expected
        finally:
            sent_first.set()
            conn.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_kill_during_put_leaves_no_partial_object(crashable):
    proc, tenant = crashable
    s3 = boto_client(proc.endpoint, tenant)
    s3.create_bucket(Bucket="crash")
    old = content("stable-v1", 3 * MiB)
    s3.put_object(Bucket="crash", Key="stable", Body=old)

    started = [threading.Event(), threading.Event()]
    threads = [
        start_slow_put(proc.endpoint, tenant, "crash", "new-object", 64 * MiB, started[0]),
        start_slow_put(proc.endpoint, tenant, "crash", "stable", 64 * MiB, started[1]),  # overwrite in flight
    ]
    for e in started:
        assert e.wait(30)
    time.sleep(0.3)
    proc.kill()
    for t in threads:
        t.join(30)

    proc.start()
    s3 = boto_client(proc.endpoint, tenant)
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket="crash", Key="new-object")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    assert s3.get_object(Bucket="crash", Key="stable")["Body"].read() == old
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="crash")["Contents"]] == ["stable"]


def test_random_kills_never_lose_acknowledged_puts(crashable):
    """Several writers; SIGKILL at a random moment; repeat. Every acknowledged object is
    present and whole; every other one is absent or whole."""
    proc, tenant = crashable
    boto_client(proc.endpoint, tenant).create_bucket(Bucket="torture")
    rng = random.Random(7)
    acked: set[str] = set()
    attempted: set[str] = set()
    for round_no in range(3):
        stop = threading.Event()
        lock = threading.Lock()

        def writer(wid: int) -> None:
            s3 = boto_client(proc.endpoint, tenant)
            i = 0
            while not stop.is_set():
                key = f"r{round_no}/w{wid}/{i}"
                size = rng.choice([0, 100, 70_000, 2 * MiB])
                with lock:
                    attempted.add(key)
                try:
                    s3.put_object(Bucket="torture", Key=key, Body=content(key, size))
                except Exception:
                    return
                with lock:
                    acked.add(key)
                i += 1

        threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(4)]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.5, 1.5))
        proc.kill()
        stop.set()
        for t in threads:
            t.join(30)
        proc.start()

    s3 = boto_client(proc.endpoint, tenant)
    present = {o["Key"]: o for p in s3.get_paginator("list_objects_v2").paginate(Bucket="torture") for o in p.get("Contents", [])}
    assert acked, "no write was acknowledged: the test did not exercise anything"
    assert acked <= set(present), f"acknowledged but lost: {sorted(acked - set(present))[:5]}"
    assert set(present) <= attempted
    for key, o in present.items():
        body = s3.get_object(Bucket="torture", Key=key)["Body"].read()
        assert body == content(key, len(body)) and o["ETag"] == f'"{hashlib.md5(body).hexdigest()}"', key
