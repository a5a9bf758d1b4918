"""The descriptor's load budget: carried exactly, refused when malformed, and never ignored by a server that predates it."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import ErrorCode, S3Error
from protocol.wire import _DESC_HEAD, Descriptor, DescriptorFlag, Target, decode_descriptor, encode_descriptor

KEYS = ["ns/a", "ns/b", "ns/c"]


def _descriptor(budget: float, window: tuple[float, ...] = ()) -> Descriptor:
    return Descriptor(KEYS, 2, 32, 64, Target(length=3 * 2 * 64), window, load_budget_s=budget)


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False), st.sampled_from([(), (0.01,), (0.02, 0.03)]))
def test_a_budget_round_trips_beside_the_compute_window(budget, window):
    d = _descriptor(budget, window)
    assert decode_descriptor(encode_descriptor(d)) == d


def test_no_budget_sends_no_flag_and_no_field():
    plain = encode_descriptor(_descriptor(0.0))
    assert not struct.unpack_from("<H", plain, _DESC_HEAD.size - 2)[0] & DescriptorFlag.LOAD_BUDGET
    assert len(encode_descriptor(_descriptor(0.1))) == len(plain) + 8


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_a_bad_budget_is_refused_naming_the_field(bad):
    with pytest.raises(S3Error, match="load_budget_s"):
        encode_descriptor(_descriptor(bad))
    good = bytearray(encode_descriptor(_descriptor(0.5)))
    struct.pack_into("<d", good, _DESC_HEAD.size + len("ns/"), bad)
    with pytest.raises(S3Error, match="load_budget_s") as e:
        decode_descriptor(bytes(good))
    assert e.value.code == ErrorCode.KVInvalidDescriptor


def test_a_flagged_budget_of_zero_or_missing_bytes_is_refused():
    data = bytearray(encode_descriptor(_descriptor(0.5)))
    struct.pack_into("<d", data, _DESC_HEAD.size + len("ns/"), 0.0)
    with pytest.raises(S3Error, match="load_budget_s"):
        decode_descriptor(bytes(data))
    truncated = encode_descriptor(_descriptor(0.5))[: _DESC_HEAD.size + len("ns/") + 4]
    with pytest.raises(S3Error, match="truncated"):
        decode_descriptor(truncated)
