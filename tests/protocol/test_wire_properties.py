"""Property tests of the wire contract: round trips, and malformed input is always a clean error."""

from __future__ import annotations

import struct

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


def _rejects_cleanly(fn, data: bytes) -> None:
    try:
        fn(data)
    except S3Error as e:
        assert e.status in (400, 500) and e.message
    # anything else (or a hang) fails the test


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(descriptors(), st.data())
def test_corrupted_descriptors_never_crash(d, data):
    body = bytearray(encode_descriptor(d))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(body) - 1))
        body[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(body)))
    _rejects_cleanly(decode_descriptor, bytes(body[:cut]))
    _rejects_cleanly(decode_descriptor, bytes(body))


@given(st.binary(max_size=300))
def test_random_bytes_never_crash(data):
    _rejects_cleanly(decode_descriptor, data)
    _rejects_cleanly(decode_descriptor, b"OCKV\x01" + data)
    _rejects_cleanly(decode_keys, b"OCKL" + data)
    _rejects_cleanly(decode_put_batch, b"OCPB" + data)


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1))
def test_huge_declared_sizes_are_refused_not_allocated(layers, count, s):
    head = struct.pack("<4sBBBBIIQI16s16sQQIHH", b"OCKV", 1, 0, 0, 0, layers, 16, s, count, bytes(16), bytes(16), 0, 2**63, 0, 0, 0)
    _rejects_cleanly(decode_descriptor, head + b"k")


def test_the_transport_is_read_from_an_intact_header_alone():
    for kind in (TransportKind.HTTP, TransportKind.SHM):
        body = encode_descriptor(Descriptor(["a/1", "a/2"], 2, 16, 64, Target(kind, length=256)))
        assert descriptor_transport(body) == kind
        assert descriptor_transport(body[:20]) is None  # truncated header
        assert descriptor_transport(b"XXXX" + body[4:]) is None and body[:4] == DESCRIPTOR_MAGIC  # not a descriptor
        assert descriptor_transport(body[:4] + bytes([99]) + body[5:]) is None  # a version this side does not speak
