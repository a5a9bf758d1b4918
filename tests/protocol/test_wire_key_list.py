"""The descriptor's compact key list: hex suffixes as raw bytes, strictly decoded, equal bytes decoded once."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def per_key_section(keys: list[str]) -> tuple[str, bytes | None]:
    """The key section's rule, key by key (what the column-wise encoder must agree with): the common prefix, cut
    back to an even suffix width, then raw bytes where every suffix is lowercase hex of one even width."""
    prefix = os.path.commonprefix(keys)
    if (len(keys[0]) - len(prefix)) % 2 and prefix:
        prefix = prefix[:-1]
    suffixes = [k[len(prefix):] for k in keys]
    width = len(suffixes[0])
    if not 2 <= width <= 510 or width % 2 or any(len(s) != width or not set(s) <= set("0123456789abcdef") for s in suffixes):
        return prefix, None
    return prefix, bytes([width // 2]) + bytes.fromhex("".join(suffixes))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text("0123456789abcdefAg/:`@\u00e9", min_size=1, max_size=10), min_size=2, max_size=6),
       st.text("0123456789abcdef/", max_size=6))
def test_the_column_wise_key_encoder_agrees_with_the_per_key_rule(tails, head):
    keys = [head + t for t in tails]
    body = encode_descriptor(descriptor(keys))
    assert decode_descriptor(body).chunk_keys == keys
    prefix, binary = per_key_section(keys)
    p = prefix.encode()
    assert body[HEAD.size:HEAD.size + len(p)] == p and HEAD.unpack_from(body)[-2] == len(p)
    assert bool(flags(body) & DescriptorFlag.BINARY_KEY_SUFFIXES) == (binary is not None)
    if binary is not None:
        assert body[HEAD.size + len(p):] == binary


def test_a_key_list_encoded_again_comes_from_the_memo_with_this_descriptors_own_header():
    from protocol import wire
    keys = [f"again/{i:032x}" for i in range(300)]
    first = encode_descriptor(descriptor(keys))
    hits = wire._ENCODED_MEMO.hits
    other = Descriptor(list(keys), 4, 16, 8, Target(region_id=b"r" * 16, token=b"t" * 16, length=len(keys) * 32))
    again = encode_descriptor(other)
    assert wire._ENCODED_MEMO.hits == hits + 1  # equal keys (another list): no per-key work
    assert again[HEAD.size:] == first[HEAD.size:] and decode_descriptor(again) == other


def test_a_key_list_changed_in_place_is_encoded_from_its_new_keys():
    keys = [f"inplace/{i:032x}" for i in range(64)]
    encode_descriptor(descriptor(keys))
    keys[7] = f"inplace/{999:032x}"  # the same list object, one key replaced
    assert decode_descriptor(encode_descriptor(descriptor(keys))).chunk_keys == keys
    keys.append(f"inplace/{1000:032x}")
    assert decode_descriptor(encode_descriptor(descriptor(keys))).chunk_keys == keys
