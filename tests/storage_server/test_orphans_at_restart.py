"""Object files a crash left unreferenced are reclaimed when the storage server starts (README: crash
safety), shown through a real restart of a storage-server process: an old orphan goes, a fresh one
(another process may be about to commit it) and every live object stay."""

from __future__ import annotations

import os
import time

from support import boto_client, split_serving


def _age(path, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_a_restarted_storage_server_reclaims_old_orphans_only(tmp_path):
    with split_serving(tmp_path) as (storage, gateway, tenant):
        s3 = boto_client(gateway.endpoint, tenant)
        s3.create_bucket(Bucket="orphans")
        s3.put_object(Bucket="orphans", Key="live", Body=b"live bytes")
        objects = tmp_path / "data" / "objects"
        (live,) = [p for p in objects.rglob("*") if p.is_file()]
        storage.stop()
        old, fresh = live.parent / ("0" * 32), live.parent / ("1" * 32)
        old.write_bytes(b"published, never committed")
        fresh.write_bytes(b"another process is about to commit this")
        for p in (live, old):
            _age(p, 2 * 3600)  # older than any write in progress
        lines_before = len(storage.output)
        storage.start()
        deadline = time.monotonic() + 30  # bounded polling of the server's own report, not a sleep
        while not any("removed 1 unreferenced object files" in line for line in storage.output[lines_before:]):
            assert time.monotonic() < deadline, "".join(storage.output[lines_before:])
            assert storage.proc.poll() is None, "".join(storage.output[lines_before:])
            time.sleep(0.05)
        assert not old.exists() and fresh.exists() and live.exists()
        assert s3.get_object(Bucket="orphans", Key="live")["Body"].read() == b"live bytes"
