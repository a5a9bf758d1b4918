"""Chunk files mapped in arena slots: exact bytes, bounded count, slots given back and reused, never unmapped while held."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from storage_server.store.mapped_files import PAGE, MappedFiles, MappedSlot
from storage_server.store.open_files import OpenFileCache


def mapped_bytes(slot: MappedSlot, size: int) -> bytes:
    """What a reader of the slot sees (straight from the mapping's address)."""
    return bytes((ctypes.c_uint8 * size).from_address(slot.arena.base + slot.index * slot.arena.slot_bytes))


@pytest.fixture
def files(tmp_path):
    paths = []
    for i in range(4):
        p = tmp_path / f"chunk{i}"
        p.write_bytes(bytes([i + 1]) * 5000)  # not a whole page: the slot is two pages
        paths.append(str(p))
    return paths


def test_a_mapped_file_reads_its_bytes_and_layers_are_rows_of_the_arena(files):
    mapper = MappedFiles(8)
    fds = [os.open(p, os.O_RDONLY) for p in files[:2]]
    slots = [mapper.map(fd, 5000) for fd in fds]
    assert all(s is not None for s in slots) and slots[0].arena is slots[1].arena  # type: ignore[union-attr]
    assert slots[0].arena.slot_bytes == 2 * PAGE  # type: ignore[union-attr]
    assert [mapped_bytes(s, 5000) for s in slots] == [bytes([1]) * 5000, bytes([2]) * 5000]  # type: ignore[arg-type]
    rows = slots[1].arena.rows(1000)  # type: ignore[union-attr]
    assert rows is None  # 1000 does not divide the slot: the executor reads such layouts with preadv
    rows = slots[1].arena.rows(1024)  # type: ignore[union-attr]
    first_row = slots[1].index * (2 * PAGE // 1024)  # type: ignore[union-attr]
    assert np.array_equal(rows[first_row + 3], np.full(1024, 2, np.uint8))
    assert mapper.status() == {"mapped": 2, "max_mapped": 8, "arenas": 1}
    for s in slots:
        mapper.unmap(s)  # type: ignore[arg-type]
    assert mapper.status()["mapped"] == 0
    for fd in fds:
        os.close(fd)
    mapper.close()


def test_a_file_of_another_length_or_past_the_bound_is_not_mapped(files):
    mapper = MappedFiles(1)
    fds = [os.open(p, os.O_RDONLY) for p in files[:2]]
    assert mapper.map(fds[0], 4096) is None  # metadata and file disagree: never map (a read past EOF would kill the server)
    first = mapper.map(fds[0], 5000)
    assert first is not None
    assert mapper.map(fds[1], 5000) is None  # the bound: read with preadv instead
    mapper.unmap(first)
    again = mapper.map(fds[1], 5000)
    assert again is not None and again.index == first.index and mapped_bytes(again, 5000) == bytes([2]) * 5000  # the slot now shows the other file
    mapper.unmap(again)
    for fd in fds:
        os.close(fd)
    mapper.close()


def test_the_open_file_cache_maps_once_keeps_held_mappings_and_unmaps_what_it_closes(files):
    cache = OpenFileCache(1, MappedFiles(8))
    cache.acquire(files[:2], [5000, 5000])
    held = cache.slots(files[:2])
    assert all(held) and cache.status()["mapped"] == 2
    os.unlink(files[0])  # deleted while held: the mapping still reads the bytes it was pinned with
    assert mapped_bytes(held[0], 5000) == bytes([1]) * 5000  # type: ignore[arg-type]
    cache.release(files[:1])  # over capacity and idle: closed and unmapped
    assert cache.status()["mapped"] == 1 and cache.status()["files"] == 1
    assert mapped_bytes(held[1], 5000) == bytes([2]) * 5000  # type: ignore[arg-type]  # still held: still mapped
    cache.acquire(files[1:2], [5000])
    assert cache.slots(files[1:2]) == held[1:]  # mapped once, reused
    cache.release(files[1:2])
    cache.release(files[1:2])
    os.unlink(files[1])
    assert cache.sweep() == 1 and cache.status()["mapped"] == 0
    cache.acquire(files[2:3])  # no sizes: opened, not mapped
    assert cache.slots(files[2:3]) == [None]
    cache.release(files[2:3])
    cache.close()
