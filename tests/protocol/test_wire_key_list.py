"""The descriptor's compact key list: hex suffixes as raw bytes, strictly decoded, equal bytes decoded once."""

from __future__ import annotations

import struct

import pytest

from protocol.errors import S3Error
from protocol.wire import Descriptor, DescriptorFlag, Target, decode_descriptor, encode_descriptor

HEAD = struct.Struct("<4sBBBBIIQI16s16sQQIHH")


def descriptor(keys: list[str]) -> Descriptor:
    return Descriptor(keys, 2, 16, 8, Target(length=len(keys) * 16))


def flags(body: bytes) -> int:
    return HEAD.unpack_from(body)[-1]


@pytest.mark.parametrize("keys", [
    [f"model/{i:032x}" for i in range(100)],  # content hashes: binary
    ["a/b1", "a/b2"],  # the common prefix ends inside the hex digits
    ["x/AB", "x/CD"],  # upper case: would not survive hex(): text
    ["ns/one", "ns/two"],  # not hex: text
    ["k/ab", "k/abcd"],  # different widths: text
])
def test_keys_round_trip_whichever_encoding_is_chosen(keys):
    body = encode_descriptor(descriptor(keys))
    assert decode_descriptor(body).chunk_keys == keys
    binary = bool(flags(body) & DescriptorFlag.BINARY_KEY_SUFFIXES)
    hexdigits = set("0123456789abcdef")
    assert binary == all(set(k.split("/", 1)[1]) <= hexdigits and len(k) == len(keys[0]) for k in keys)


def test_hash_keys_take_half_the_bytes_and_decode_to_the_same_list_again():
    keys = [f"model/{i:032x}" for i in range(1000)]
    body = encode_descriptor(descriptor(keys))
    text = sum(len(k) - len("model/") + 1 for k in keys)
    assert len(body) - HEAD.size < text * 0.55
    first, second = decode_descriptor(body).chunk_keys, decode_descriptor(bytes(body)).chunk_keys
    assert first is second and first.distinct == 1000


def test_a_binary_key_list_of_the_wrong_length_is_refused_naming_the_field():
    body = encode_descriptor(descriptor([f"m/{i:08x}" for i in range(4)]))
    for bad in (body[:-1], body + b"\0"):
        with pytest.raises(S3Error) as e:
            decode_descriptor(bad)
        assert e.value.extra["Field"] == "chunk_keys"
