"""Decoded copies in the mapped arena (:class:`storage_server.decoded_copies.DecodedCopies` with the store's
:class:`~storage_server.store.mapped_files.MappedFiles`): a copy is mapped while kept, never unmapped (or its slot
given to another file) while a transfer holds it, and once evicted its slot's next owner is never read as the copy.

In-process: real files and real mappings; the kv-gets over every transport are in ``test_decoded_copies.py``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from compressionsupport import kv_chunks, kv_layout

from protocol.codecs import SliceLayout, codec_by_name
from protocol.compressed_chunk import decode_header, encode_chunk
from storage_server.decoded_copies import DecodedCopies
from storage_server.store.mapped_files import MappedFiles

LAYOUT = kv_layout(64)
S = LAYOUT.per_layer_chunk_bytes


def _stored(tmp: Path, name: str, raw: np.ndarray):
    """A zstd chunk file of ``raw`` (L·S bytes): its open fd and header."""
    layout = SliceLayout(2, LAYOUT.chunk_tokens, LAYOUT.kv_heads * LAYOUT.head_dim)
    data = encode_chunk([raw[i * S : (i + 1) * S] for i in range(LAYOUT.num_layers)], codec_by_name("zstd"), "bfloat16", layout)
    path = tmp / name
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    return fd, decode_header(name, data, len(data), layers=LAYOUT.num_layers, slice_bytes=S)


def _settled(copies: DecodedCopies) -> dict:
    deadline = time.monotonic() + 60
    while (st := copies.status())["pending"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert st["pending"] == 0, st
    return st


def _copy_and_take(copies: DecodedCopies, fd: int, header, key: str):
    """Fill a copy of one chunk, then take it: the Taken (its copy's slot in ``mapped[0]``)."""
    first = copies.take([fd], [0], [header], [None])
    copies.fill(first, [fd], [header], [key])
    copies.release(first, used=False)
    _settled(copies)
    return copies.take([fd], [0], [header], [None])


def _rows(taken) -> np.ndarray:
    """The bytes at the taken copy's slot, read through the arena as the executor's gather does."""
    slot = taken.mapped[0]
    rows = slot.arena.rows(S)
    first = slot.index * (slot.arena.slot_bytes // S)
    return np.concatenate([rows[first + layer] for layer in range(LAYOUT.num_layers)])


@pytest.fixture
def mapper():
    m = MappedFiles(64)
    if m.max_mapped == 0:
        pytest.skip("no mappings on this platform")
    yield m
    m.close()


def test_a_copy_is_mapped_and_its_rows_are_the_decoded_chunk(tmp_path, mapper):
    a = kv_chunks(LAYOUT, 1, seed=1)[0]
    fd, header = _stored(tmp_path, "a", a)
    copies = DecodedCopies(tmp_path / "copies", 2 * LAYOUT.chunk_bytes, mapper=mapper)
    try:
        taken = _copy_and_take(copies, fd, header, "a")
        assert taken.count == 1 and taken.headers is None and taken.mapped[0] is not None, taken
        assert np.array_equal(_rows(taken), a)
        copies.release(taken)
        assert copies.status()["mapped"] == 1
    finally:
        copies.close()
        os.close(fd)
    assert mapper.status()["mapped"] == 0  # close unmapped it: the store's arenas may go now


def test_an_evicted_copy_is_never_read_after_its_slot_is_reused(tmp_path, mapper):
    a, b = kv_chunks(LAYOUT, 2, seed=2)
    (fa, ha), (fb, hb) = _stored(tmp_path, "a", a), _stored(tmp_path, "b", b)
    copies = DecodedCopies(tmp_path / "copies", LAYOUT.chunk_bytes, mapper=mapper)  # room for one copy
    try:
        ta = _copy_and_take(copies, fa, ha, "a")
        slot_a = ta.mapped[0]
        copies.release(ta)
        tb = _copy_and_take(copies, fb, hb, "b")  # a's copy evicted for b's, which maps where a's was
        assert copies.status()["evicted"] == 1
        assert (tb.mapped[0].arena, tb.mapped[0].index) == (slot_a.arena, slot_a.index), "the slot was not reused"
        assert np.array_equal(_rows(tb), b)
        copies.release(tb)
        again = copies.take([fa], [0], [ha], [None])
        assert again.count == 0 and again.headers == [ha] and again.mapped == [None], again  # decoded afresh, not b's rows
        copies.release(again, used=False)
    finally:
        copies.close()
        os.close(fa)
        os.close(fb)


def test_a_copy_a_transfer_holds_stays_mapped_while_others_would_need_its_room(tmp_path, mapper):
    a, b = kv_chunks(LAYOUT, 2, seed=4)
    (fa, ha), (fb, hb) = _stored(tmp_path, "a", a), _stored(tmp_path, "b", b)
    copies = DecodedCopies(tmp_path / "copies", LAYOUT.chunk_bytes, mapper=mapper)
    try:
        held = _copy_and_take(copies, fa, ha, "a")  # a transfer reads a's copy ...
        first = copies.take([fb], [0], [hb], [None])
        copies.fill(first, [fb], [hb], ["b"])  # ... while b's copy wants its room
        copies.release(first, used=False)
        st = _settled(copies)
        assert st["evicted"] == 0 and st["skipped"] == 1 and st["chunks"] == 1, st
        assert np.array_equal(_rows(held), a)  # still a's bytes at a's slot
        copies.release(held)
    finally:
        copies.close()
        os.close(fa)
        os.close(fb)


def test_copies_map_at_most_half_of_the_mappings_and_the_rest_are_still_served(tmp_path):
    mapper = MappedFiles(4)
    if mapper.max_mapped < 4:
        pytest.skip("no mappings on this platform")
    raws = kv_chunks(LAYOUT, 3, seed=6)
    stored = [_stored(tmp_path, f"c{i}", raw) for i, raw in enumerate(raws)]
    copies = DecodedCopies(tmp_path / "copies", 3 * LAYOUT.chunk_bytes, mapper=mapper)
    try:
        taken = [_copy_and_take(copies, fd, header, f"c{i}") for i, (fd, header) in enumerate(stored)]
        assert [t.count for t in taken] == [1, 1, 1]
        assert [t.mapped[0] is not None for t in taken] == [True, True, False]  # the store's files keep 2 of 4
        assert np.array_equal(_rows(taken[1]), raws[1])
        for t in taken:
            copies.release(t)
        assert copies.status()["mapped"] == 2 and mapper.status()["mapped"] == 2
    finally:
        copies.close()
        for fd, _ in stored:
            os.close(fd)
        mapper.close()


def test_a_kv_get_that_reserved_no_descriptor_for_copies_opens_none_but_still_fills(tmp_path, mapper):
    a, b = kv_chunks(LAYOUT, 2, seed=8)
    (fa, ha), (fb, hb) = _stored(tmp_path, "a", a), _stored(tmp_path, "b", b)
    copies = DecodedCopies(tmp_path / "copies", 4 * LAYOUT.chunk_bytes, mapper=mapper)
    try:
        assert not copies.holds_any
        copies.release(_copy_and_take(copies, fa, ha, "a"))  # a's copy exists now
        assert copies.holds_any
        taken = copies.take([fa, fb], [0, 0], [ha, hb], [None, None], open_copies=False)
        assert taken.count == 0 and taken.opened == [] and taken.headers == [ha, hb], taken
        copies.fill(taken, [fa, fb], [ha, hb], ["a", "b"])
        copies.release(taken, used=False)
        assert _settled(copies)["chunks"] == 2  # b's copy filled from that kv-get all the same
    finally:
        copies.close()
        os.close(fa)
        os.close(fb)


def test_copies_still_being_written_count_as_their_tenants_when_another_makes_room(tmp_path, mapper):
    """b keeps two copies; a cold kv-get of a's is writing three (reserved, not kept yet). A fourth of a's may not
    evict b's: a already holds more than b in copies being written (uncounted, b would lose one of its two)."""
    unit = LAYOUT.chunk_bytes
    copies = DecodedCopies(tmp_path / "copies", 5 * unit, mapper=mapper)
    try:
        for j in range(2):
            tmp = copies.reserve(unit, "b")
            assert tmp is not None
            tmp.write_bytes(bytes(unit))
            copies.adopt(("b", j), tmp, unit, "b")
        writing = [copies.reserve(unit, "a") for _ in range(3)]
        assert all(t is not None for t in writing)
        assert copies.reserve(unit, "a") is None  # no room within the fair share: b keeps both
        assert copies.status()["chunks"] == 2 and copies.evicted == 0
        for t in writing:
            copies.unreserve(t, unit, "a")  # a's kv-get gave up on them: their room is free again
        assert copies.reserve(unit, "a") is not None and copies.evicted == 0
    finally:
        copies.close()
