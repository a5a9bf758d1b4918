"""Property tests of the wire contract: round trips, and malformed input is always a clean error."""

from __future__ import annotations

import struct
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.errors import S3Error
from protocol.wire import (
    DESCRIPTOR_MAGIC,
    Descriptor,
    Mode,
    Target,
    TransportKind,
    decode_descriptor,
    decode_keys,
    decode_put_batch,
    descriptor_transport,
    encode_descriptor,
    encode_keys,
    encode_put_batch,
)

key_text = st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), min_size=1, max_size=60)
keys_st = st.lists(key_text, min_size=1, max_size=50)


@st.composite
def descriptors(draw) -> Descriptor:
    keys = draw(keys_st)
    layers = draw(st.integers(1, 128))
    s = draw(st.integers(1, 1 << 20))
    payload = len(keys) * layers * s
    window = draw(st.sampled_from([(), (0.01,), None]))
    if window is None:
        window = tuple(draw(st.lists(st.floats(0, 10), min_size=layers, max_size=layers)))
    target = Target(
        draw(st.sampled_from([TransportKind.HTTP, TransportKind.SHM])),
        draw(st.binary(min_size=16, max_size=16)),
        draw(st.binary(min_size=16, max_size=16)),
        draw(st.integers(0, 1 << 40)),
        payload + draw(st.integers(0, 1000)),
    )
    return Descriptor(keys, layers, draw(st.integers(1, 1024)), s, target, window, draw(st.sampled_from(list(Mode))),
                      layer_checksums=draw(st.booleans()))


@given(descriptors())
def test_descriptor_round_trip(d):
    assert decode_descriptor(encode_descriptor(d)) == d


@given(keys_st)
def test_key_list_round_trip(keys):
    assert decode_keys(encode_keys(keys)) == keys


@given(st.lists(st.tuples(key_text, st.binary(max_size=200)), max_size=20))
def test_put_batch_round_trip(items):
    body = b"".join(bytes(p) for p in encode_put_batch(items))
    assert [(k, bytes(v)) for k, v in decode_put_batch(body)] == items


def _decodes_or_rejects_cleanly(fn, data: bytes, reencode=None) -> None:
    """Corrupted input may still be a valid message; then it must be one (it survives a round trip).
    Otherwise the only way out is an S3Error with a 400 status and a message."""
    try:
        value = fn(data)
    except S3Error as e:
        assert e.status == 400 and e.message, (e.status, e.message)
        return
    if reencode is not None:
        again = reencode(value)
        assert fn(again if isinstance(again, bytes) else b"".join(bytes(p) for p in again)) == value


def _put_batch_items(data: bytes) -> list[tuple[str, bytes]]:
    return [(k, bytes(v)) for k, v in decode_put_batch(data)]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(descriptors(), st.data())
def test_corrupted_descriptors_never_crash(d, data):
    body = bytearray(encode_descriptor(d))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(body) - 1))
        body[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(body)))
    _decodes_or_rejects_cleanly(decode_descriptor, bytes(body[:cut]), encode_descriptor)
    _decodes_or_rejects_cleanly(decode_descriptor, bytes(body), encode_descriptor)


@given(st.binary(max_size=300))
def test_random_bytes_never_crash(data):
    _decodes_or_rejects_cleanly(decode_descriptor, data, encode_descriptor)
    _decodes_or_rejects_cleanly(decode_descriptor, b"OCKV\x01" + data, encode_descriptor)
    _decodes_or_rejects_cleanly(decode_keys, b"OCKL" + data, encode_keys)
    _decodes_or_rejects_cleanly(_put_batch_items, b"OCPB" + data, encode_put_batch)


# A decoder must check what a header declares against what the body carries before it allocates
# anything of that size: these bodies carry one one-byte key whatever the header says.
DECODE_ALLOCATION_LIMIT = 64 << 10


@settings(max_examples=200)
@given(st.integers(0, 2**32 - 1), st.integers(2, 2**32 - 1), st.integers(0, 2**64 - 1), st.integers(0, 2**16 - 1))
def test_huge_declared_sizes_are_refused_not_allocated(layers, count, s, n_window):
    head = struct.pack("<4sBBBBIIQI16s16sQQIHH", b"OCKV", 1, 0, 0, 0, layers, 16, s, count, bytes(16), bytes(16), 0, 2**63, n_window, 0, 0)
    body = head + b"k"
    tracemalloc.start()
    try:
        with pytest.raises(S3Error) as refused:
            decode_descriptor(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert refused.value.status == 400 and refused.value.message
    assert peak < DECODE_ALLOCATION_LIMIT, f"decoding a {len(body)}-byte descriptor allocated {peak} bytes"


@settings(max_examples=100)
@given(st.integers(2, 2**32 - 1), st.integers(0, 2**16 - 1))
def test_huge_declared_key_and_item_counts_are_refused_not_allocated(count, prefix_len):
    for decode, body in ((decode_keys, struct.pack("<4sHI", b"OCKL", prefix_len, count) + b"k"),
                         (decode_put_batch, struct.pack("<4sI", b"OCPB", count) + struct.pack("<HQ", 1, 2**63) + b"k")):
        tracemalloc.start()
        try:
            with pytest.raises(S3Error) as refused:
                decode(body)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert refused.value.status == 400 and refused.value.message
        assert peak < DECODE_ALLOCATION_LIMIT, f"{decode.__name__} of {len(body)} bytes allocated {peak} bytes"


def test_the_transport_is_read_from_an_intact_header_alone():
    for kind in (TransportKind.HTTP, TransportKind.SHM):
        body = encode_descriptor(Descriptor(["a/1", "a/2"], 2, 16, 64, Target(kind, length=256)))
        assert descriptor_transport(body) == kind
        assert descriptor_transport(body[:20]) is None  # truncated header
        assert descriptor_transport(b"XXXX" + body[4:]) is None and body[:4] == DESCRIPTOR_MAGIC  # not a descriptor
        assert descriptor_transport(body[:4] + bytes([99]) + body[5:]) is None  # a version this side does not speak
