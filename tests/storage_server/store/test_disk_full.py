"""A full disk is a clear 507 InsufficientStorage, nothing partial remains, and the store keeps working."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from support import ServerProcess, boto_client, make_tenants, write_config

from protocol.errors import ErrorCode, S3Error
from storage_server.store import PutSpec
from storage_server.store.localdisk import LocalDiskChunkSource, LocalDiskStore


@contextlib.contextmanager
def small_filesystem(path: Path, size: str):
    """A tmpfs of ``size`` mounted at ``path`` (the test needs root, as `make test` runs here)."""
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill ({r.stderr.strip() or 'mount failed'}); needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


async def body(data: bytes):
    yield data


async def in_pieces(data: bytes, size: int):
    """``data`` as a network delivers it under load: pieces smaller than the file's write buffer."""
    for i in range(0, len(data), size):
        yield data[i:i + size]


def used_bytes(root: Path) -> int:
    s = os.statvfs(root)
    return (s.f_blocks - s.f_bfree) * s.f_frsize


def test_the_store_answers_insufficient_storage_and_keeps_nothing_partial(tmp_path):
    with small_filesystem(tmp_path / "small", "2m") as root:
        async def scenario():
            store = LocalDiskStore(root / "data", io_threads=2)
            chunks = LocalDiskChunkSource(store, 64, 1 << 30)
            try:
                await store.create_bucket("b", "t", "us-east-1")
                for attempt in (store.put_object("b", "big", body(os.urandom(3 << 20)), PutSpec(), "t"),
                                chunks.put_chunks("b", [(f"c/{i}", memoryview(os.urandom(512 << 10))) for i in range(6)], "t")):
                    with pytest.raises(S3Error) as e:
                        await attempt
                    assert e.value.code == ErrorCode.InsufficientStorage and e.value.status == 507
                assert list((root / "data" / "tmp").iterdir()) == []
                assert (await store.list_objects("b")).objects == []
                await store.put_object("b", "small", body(b"fits"), PutSpec(), "t")  # still working
                assert (await store.head_object("b", "small")).size == 4
            finally:
                await chunks.close()
                await store.close()

        asyncio.run(scenario())


def test_a_refused_upload_in_small_pieces_frees_its_space_before_the_507(tmp_path):
    """Pieces smaller than the temp file's write buffer leave bytes in it when the disk fills, so closing the file
    fails with ENOSPC too. That second failure once skipped the unlink: the partial file kept the disk full and
    the next PUT, even 4 bytes, answered 500 InternalError."""
    with small_filesystem(tmp_path / "small", "2m") as root:
        async def scenario():
            store = LocalDiskStore(root / "data", io_threads=2)
            try:
                await store.create_bucket("b", "t", "us-east-1")
                before = used_bytes(root)
                with pytest.raises(S3Error) as e:
                    await store.put_object("b", "big", in_pieces(os.urandom(3 << 20), 3000), PutSpec(), "t")
                assert e.value.code == ErrorCode.InsufficientStorage and e.value.status == 507, e.value
                assert list((root / "data" / "tmp").iterdir()) == []
                assert used_bytes(root) == before  # freed before the 507 was raised, not some time later
                await store.put_object("b", "small", body(b"fits"), PutSpec(), "t")
                assert (await store.head_object("b", "small")).size == 4
            finally:
                await store.close()

        asyncio.run(scenario())


def test_a_put_through_the_gateway_onto_a_full_disk_is_507(tmp_path):
    with small_filesystem(tmp_path / "small", "4m") as root:
        tenant = make_tenants("t")[0]
        config = write_config(tmp_path / "c.toml", root / "data", [tenant], extra=f'\n[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\n')
        proc = ServerProcess(config).start()
        try:
            s3 = boto_client(proc.endpoint, tenant)
            s3.create_bucket(Bucket="full")
            before = used_bytes(root)
            with pytest.raises(ClientError) as e:
                s3.put_object(Bucket="full", Key="big", Body=os.urandom(6 << 20))
            assert e.value.response["Error"]["Code"] == "InsufficientStorage"
            assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 507
            # The refused upload's space is free when its 507 arrives (checked at once, not after a wait).
            assert used_bytes(root) == before, (used_bytes(root), before, sorted((root / "data" / "tmp").iterdir()))
            assert s3.list_objects_v2(Bucket="full")["KeyCount"] == 0
            s3.put_object(Bucket="full", Key="small", Body=b"fits")
            assert s3.get_object(Bucket="full", Key="small")["Body"].read() == b"fits"
        except BaseException:
            print("server output:\n" + "".join(proc.output))
            raise
        finally:
            proc.stop()
