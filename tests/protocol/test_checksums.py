"""CRC32C of adjacent runs joined without reading the bytes again (the storage server's readers checksum in parallel)."""

from __future__ import annotations

from awscrt.checksums import crc32c
from hypothesis import given
from hypothesis import strategies as st

from protocol.checksums import crc32c_combine


@given(st.binary(max_size=4096), st.binary(max_size=4096))
def test_combining_two_runs_gives_the_crc_of_both(a: bytes, b: bytes):
    assert crc32c_combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b)


@given(st.lists(st.binary(min_size=1, max_size=512), min_size=1, max_size=12))
def test_runs_combined_in_order_give_the_crc_of_the_whole(runs: list[bytes]):
    crc = 0
    for r in runs:
        crc = crc32c_combine(crc, crc32c(r), len(r))
    assert crc == crc32c(b"".join(runs))


def test_a_long_run_is_joined_by_its_length_not_by_reading_it():
    a, b = b"layer zero, chunk 0..k", bytes(range(256)) * (1 << 14)  # 4 MiB
    assert crc32c_combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b)
    assert crc32c_combine(crc32c(a), crc32c(b""), 0) == crc32c(a)
