"""The open-file cache: chunk files stay open between transfers, never closed under a running one."""

from __future__ import annotations

import os
import time

import pytest
from kvsupport import client, keys_for, make_chunks, rpc, run, tiny_layout
from support import boto_client, serving

from storage_server.store.open_files import MissingFile, OpenFileCache


@pytest.fixture
def files(tmp_path):
    paths = []
    for i in range(6):
        p = tmp_path / f"obj{i}"
        p.write_bytes(bytes([i]) * 8)
        paths.append(str(p))
    return paths


def test_a_second_transfer_reuses_the_open_fds(files):
    cache = OpenFileCache(16)
    first = cache.acquire(files[:3])
    cache.release(files[:3])
    assert cache.acquire(files[:3]) == first
    assert [os.pread(fd, 1, 0) for fd in first] == [b"\x00", b"\x01", b"\x02"]
    assert cache.status() | {"capacity": 16} == {"files": 3, "in_use": 3, "capacity": 16, "hits": 3, "misses": 3,
                                                       "forgotten_in_use": 0}
    cache.close()


def test_files_all_open_already_are_held_without_opening_and_any_other_is_left_to_acquire(files):
    cache = OpenFileCache(16)
    assert cache.acquire_held(files[:3]) is None  # nothing open yet: nothing taken
    first = cache.acquire(files[:2])
    cache.release(files[:2])
    assert cache.acquire_held(files[:3]) is None and cache.status()["in_use"] == 0  # obj2 needs an open: all or nothing
    fds, mapped = cache.acquire_held(files[1::-1])  # type: ignore[misc]
    assert fds == first[::-1] and mapped == [None, None] and cache.status()["in_use"] == 2
    cache.release(files[:2])
    assert cache.status()["in_use"] == 0
    cache.close()


def test_idle_files_beyond_capacity_are_closed_oldest_first_but_never_in_use_ones(files):
    cache = OpenFileCache(2)
    busy = cache.acquire(files[:3])  # over capacity, but all three are in use
    assert cache.status()["files"] == 3
    cache.release(files[:1])  # obj0 is idle and the oldest: closed
    assert cache.status()["files"] == 2
    assert all(os.pread(fd, 1, 0) for fd in busy[1:])  # still open and readable
    with pytest.raises(OSError):
        os.fstat(busy[0])
    cache.release(files[1:3])
    cache.close()


def _rewrite(path: str, data: bytes) -> None:
    """A store that reuses a name: the old file unlinked, a new one renamed into its place."""
    os.unlink(path)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.rename(path + ".tmp", path)


def test_a_forgotten_idle_file_is_closed_and_the_next_acquire_opens_the_new_one_at_its_name(files):
    cache = OpenFileCache(16)
    old = cache.acquire(files[:1])
    cache.release(files[:1])
    _rewrite(files[0], b"new bytes")
    cache.forget(files[0])
    with pytest.raises(OSError):
        os.fstat(old[0])  # closed at once: nobody held it
    new = cache.acquire(files[:1])
    assert os.pread(new[0], 9, 0) == b"new bytes" and cache.status()["misses"] == 2
    cache.release(files[:1], new)
    cache.close()


def test_a_forgotten_file_a_transfer_holds_stays_readable_until_that_transfer_releases_it(files):
    cache = OpenFileCache(16)
    held = cache.acquire(files[:2])
    _rewrite(files[0], b"new bytes")
    cache.forget(files[0])
    assert os.pread(held[0], 8, 0) == b"\x00" * 8 and cache.status()["forgotten_in_use"] == 1  # the holder's bytes
    newer = cache.acquire(files[:1])  # a later transfer gets the file now at that name
    assert newer[0] != held[0] and os.pread(newer[0], 9, 0) == b"new bytes"
    cache.release(files[:2], held)  # by fd: the forgotten entry is the one given back, and closed
    assert cache.status()["forgotten_in_use"] == 0 and cache.status()["in_use"] == 1
    with pytest.raises(OSError):
        os.fstat(held[0])
    assert os.pread(newer[0], 9, 0) == b"new bytes"
    cache.release(files[:1], newer)
    assert cache.status()["in_use"] == 0
    cache.close()


def test_a_missing_file_names_its_index_and_holds_nothing(files, tmp_path):
    cache = OpenFileCache(16)
    wanted = files[:2] + [str(tmp_path / "gone")] + files[2:3]
    with pytest.raises(MissingFile) as e:
        cache.acquire(wanted)
    assert e.value.index == 2
    assert cache.status()["in_use"] == 0
    cache.close()


def test_sweep_closes_idle_fds_of_unlinked_files_only(files):
    cache = OpenFileCache(16)
    cache.acquire(files[:3])
    cache.release(files[:2])  # obj0 and obj1 idle, obj2 in use
    os.unlink(files[0])
    os.unlink(files[2])
    assert cache.sweep() == 1  # obj0: idle and unlinked; obj1 is still linked, obj2 still in use
    assert cache.status()["files"] == 2
    cache.release(files[2:3])
    assert cache.sweep() == 1
    assert cache.status()["files"] == 1
    cache.close()


def test_the_daemon_frees_deleted_chunks_held_open_within_a_sweep_period(tmp_path):
    """Deleting through the gateway (another process) frees the disk space of a cached chunk file."""
    with serving(tmp_path, housekeeping_s=0.2) as (proc, tenant, sock):
        s3 = boto_client(proc.endpoint, tenant)
        s3.create_bucket(Bucket="sweep")
        layout = tiny_layout(16, num_layers=4)
        keys = keys_for(layout, 10, "sweep")

        async def fetch_then_delete():
            async with client(proc, tenant, "sweep") as c:
                await c.put_chunks(keys, make_chunks(layout, 10, seed=1), layout)
                await c.fetch(keys, layout, "http")

        run(fetch_then_delete())
        assert rpc(str(sock), "status")["open_file_cache"]["files"] == 10
        s3.delete_objects(Bucket="sweep", Delete={"Objects": [{"Key": k} for k in keys[:4]]})
        deadline = time.monotonic() + 10
        while rpc(str(sock), "status")["open_file_cache"]["files"] != 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rpc(str(sock), "status")["open_file_cache"]["files"] == 6
