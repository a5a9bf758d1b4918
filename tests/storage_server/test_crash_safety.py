"""Acknowledged writes survive a crash; unacknowledged ones are absent or whole, never torn."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import os
import random
import threading
import time
from pathlib import Path
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


def test_kill_right_after_concurrent_small_puts_are_acknowledged(crashable):
    """16 writers of 4 KiB objects (their commits are grouped); SIGKILL the instant the 48th PUT is
    acknowledged. Every acknowledged object is present and whole after the restart."""
    proc, tenant = crashable
    boto_client(proc.endpoint, tenant).create_bucket(Bucket="group")
    acked: set[str] = set()
    lock = threading.Lock()
    killed = threading.Event()
    clients = [boto_client(proc.endpoint, tenant) for _ in range(16)]

    def writer(wid: int) -> None:
        for i in range(1000):
            key = f"w{wid}/{i}"
            try:
                clients[wid].put_object(Bucket="group", Key=key, Body=content(key, 4096))
            except Exception:
                return
            with lock:
                acked.add(key)
                if len(acked) >= 48 and not killed.is_set():
                    proc.kill()  # right after an acknowledgement, with the others' commits in flight
                    killed.set()
                    return

    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert killed.is_set()
    proc.start()
    s3 = boto_client(proc.endpoint, tenant)
    for key in sorted(acked):
        assert s3.get_object(Bucket="group", Key=key)["Body"].read() == content(key, 4096), key


def _age(path, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_crash_leftovers_are_reclaimed_but_writes_in_progress_and_live_objects_are_not(tmp_path):
    """A crash between publishing a file and committing its row (or between a commit and the unlink of
    the file it replaced) leaves a file nothing references; it is removed once it is older than any write."""
    from storage_server.store import PutSpec
    from storage_server.store.localdisk import LocalDiskStore

    async def scenario():
        store = LocalDiskStore(tmp_path / "data", io_threads=2)
        await store.create_bucket("b", "t", "us-east-1")
        meta = await store.put_object("b", "live", _body(b"live bytes"), PutSpec(), "t")
        live = Path(meta.locator)
        assert live.is_file() and live.is_relative_to(tmp_path / "data" / "objects")
        shard = live.parent
        old_orphan, new_orphan = shard / ("0" * 32), shard / ("1" * 32)
        old_orphan.write_bytes(b"published, never committed")
        new_orphan.write_bytes(b"another process is about to commit this")
        for p in (live, old_orphan):
            _age(p, 2 * 3600)
        assert await store.reclaim_orphans() == 1
        assert not old_orphan.exists() and new_orphan.exists() and live.exists()
        reader = await store.open_object("b", "live", prefetch=64)
        assert reader.head == b"live bytes"
        reader.close()
        await store.close()

    asyncio.run(scenario())


def test_opening_the_store_sweeps_only_stale_temp_files(tmp_path):
    """The gateway and the storage server both open the store: one (re)starting must not delete the
    other's upload in progress, only temp files no write has touched for an hour."""
    from storage_server.store.localdisk import LocalDiskStore

    asyncio.run(LocalDiskStore(tmp_path / "data", io_threads=1).close())
    stale, in_progress = tmp_path / "data" / "tmp" / "stale", tmp_path / "data" / "tmp" / "in-progress"
    stale.write_bytes(b"x")
    in_progress.write_bytes(b"y")
    _age(stale, 2 * 3600)
    asyncio.run(LocalDiskStore(tmp_path / "data", io_threads=1).close())
    assert not stale.exists() and in_progress.exists()


async def _body(data: bytes):
    yield data
