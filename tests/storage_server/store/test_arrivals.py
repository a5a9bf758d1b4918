"""Arrivals: a kv-get's chunks received from peers straight into memory, gathered from there, cached afterwards."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

from storage_server.store.cache.chunk_files import ChunkFiles
from storage_server.store.s3.arrivals import Arrivals, MemfdPool, Owed, copy_rows, land


def test_a_chunk_of_the_arena_size_is_received_in_its_row_and_any_other_size_gets_no_row():
    a = Arrivals.make(4, 64)
    row = a.row(2, 64)
    assert row is not None and len(row) == 64
    row[:] = bytes(range(64))
    assert a.holds(2, row) and not a.holds(1, row) and not a.holds(2, bytearray(64))
    assert a.row(2, 65) is None and a.row(4, 64) is None  # a compressed chunk, a row past the end
    assert bytes(a.view(2)) == bytes(range(64))
    a.let_go()


def test_rows_of_a_layer_slice_are_what_the_executor_gathers():
    a = Arrivals.make(3, 32)
    for j in range(3):
        a.view(j)[:] = bytes([j]) * 32
    rows = a.rows(8)  # 4 layers of 8 bytes per chunk
    first = np.arange(3) * 4
    layer = 2
    assert [bytes(rows[f + layer]) for f in first] == [bytes([j]) * 8 for j in range(3)]
    a.let_go()


def test_the_memory_is_given_back_only_when_every_holder_let_go_and_a_view_still_held_stays_readable():
    a = Arrivals.make(2, 16)
    a.view(0)[:] = b"x" * 16
    kept = a.rows(16)  # what an executor still holds
    a.hold()
    a.let_go()
    assert a.fd >= 0 and os.fstat(a.fd)  # one holder left
    a.let_go()
    assert a.fd == -1
    assert bytes(kept[0]) == b"x" * 16  # the mapping lives as long as a view of it


def test_an_idle_buffer_is_reused_by_the_next_kv_get_of_a_similar_size_but_not_of_a_much_smaller_one():
    pool = MemfdPool(keep=1)
    fd, m = pool.take(32 << 10)
    m[:4] = b"seen"
    pool.give(fd, m)
    again = pool.take(24 << 10)  # three quarters of the idle buffer: reused, its pages already in memory
    assert again[0] == fd and again[1][:4] == b"seen"
    pool.give(*again)
    other = pool.take(4 << 10)  # an eighth of it: a buffer of its own
    assert other[0] != fd
    pool.give(*other)  # the pool keeps one: this one is freed
    assert pool.take(32 << 10)[0] == fd


def test_cached_files_are_copied_into_their_rows(tmp_path):
    a = Arrivals.make(2, 8)
    fds = []
    for j in range(2):
        p = tmp_path / f"c{j}"
        p.write_bytes(bytes([j + 1]) * 8)
        fds.append(os.open(p, os.O_RDONLY))
    copy_rows(fds, [a.view(1), a.view(0)])
    assert bytes(a.view(1)) == b"\x01" * 8 and bytes(a.view(0)) == b"\x02" * 8
    for fd in fds:
        os.close(fd)
    a.let_go()


class _Cache:
    """The two things landing asks of the chunk cache beside its files: claims and what was dropped while claimed."""

    def __init__(self, files: ChunkFiles, stale: set[str]) -> None:
        self.files, self._stale, self.released, self.arrived_cached = files, stale, [], 0

    def release(self, cid: str) -> None:
        self.released.append(cid)

    def stale(self, cid: str) -> bool:
        return cid in self._stale


def test_landing_writes_the_owed_chunks_into_the_cache_with_their_versions_but_never_a_stale_one(tmp_path):
    files = ChunkFiles(tmp_path / "cache", 1 << 20)
    a = Arrivals.make(3, 16)
    for j in range(3):
        a.view(j)[:] = bytes([j]) * 16
    cache = _Cache(files, stale={"c" * 40})
    owed = [Owed(0, "a" * 40, "v0", None), Owed(1, "b" * 40, "", "a" * 40), Owed(2, "c" * 40, "v2", "b" * 40)]
    a.hold()  # the landing's
    asyncio.run(land(cache, a, owed, "alice"))
    assert files.size("a" * 40) == 16 and files.version("a" * 40) == "v0"
    assert (tmp_path / "cache" / "aa" / f"{'a' * 40}.16.v0").read_bytes() == b"\x00" * 16
    assert files.size("b" * 40) == 16 and files.size("c" * 40) is None  # deleted while it was in flight: not cached
    assert set(cache.released) == {o.cid for o in owed} and cache.arrived_cached == 2  # every claim given back
    assert a.fd >= 0  # the pin's hold remains
    a.let_go()
    assert a.fd == -1


@pytest.mark.parametrize("room", [16, 0])
def test_landing_keeps_what_fits_and_drops_the_rest(tmp_path, room):
    files = ChunkFiles(tmp_path / "cache", room)
    a = Arrivals.make(1, 16)
    cache = _Cache(files, stale=set())
    a.hold()
    asyncio.run(land(cache, a, [Owed(0, "d" * 40, "", None)], ""))
    assert (files.size("d" * 40) is not None) == bool(room) and cache.released == ["d" * 40] * (2 if room else 1)
    a.let_go()
