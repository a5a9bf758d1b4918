"""Key list references (the session socket's): a descriptor names its keys with a 16-byte reference, and a later one
sends the reference alone; only a resolver (the session's names) turns it back into keys, and anything else is refused
naming the field."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import ErrorCode, S3Error
from protocol.wire import _DESC_HEAD as HEAD
from protocol.wire import KEY_LIST_REF_BYTES, Descriptor, DescriptorFlag, Target, TransportKind, decode_descriptor, encode_descriptor

REF = bytes(range(KEY_LIST_REF_BYTES))


def _descriptor(keys: list[str], **kw) -> Descriptor:
    return Descriptor(keys, 4, 16, 8, Target(TransportKind.SHM, length=len(keys) * 32), **kw)


def _keys(n: int, stem: str = "ns") -> list[str]:
    return [f"{stem}/{hashlib.blake2b(str(i).encode(), digest_size=16).hexdigest()}" for i in range(n)]


@given(st.integers(1, 300), st.sampled_from(["ns", "a/b", "x"]))
def test_a_named_key_list_carries_its_keys_and_its_reference(n, stem):
    d = _descriptor(_keys(n, stem), key_ref=REF)
    body = encode_descriptor(d)
    assert HEAD.unpack_from(body)[-1] & DescriptorFlag.KEY_LIST_NAMED
    assert decode_descriptor(body) == d  # no resolver needed: the keys are there


def test_a_reference_alone_is_sixteen_bytes_and_resolves_to_the_keys_it_named():
    keys = _keys(3584)
    by_ref = encode_descriptor(_descriptor(keys, key_ref=REF, keys_by_ref=True))
    assert len(by_ref) == HEAD.size + KEY_LIST_REF_BYTES
    assert len(encode_descriptor(_descriptor(keys))) > 3584 * 16
    asked = []
    d = decode_descriptor(by_ref, named_keys=lambda ref: asked.append(ref) or keys)
    assert asked == [REF] and d.chunk_keys == keys and d.keys_by_ref and d.key_ref == REF
    assert d.payload_bytes == 3584 * 4 * 8


def test_a_reference_is_refused_where_nothing_resolves_it():
    body = encode_descriptor(_descriptor(_keys(4), key_ref=REF, keys_by_ref=True))
    with pytest.raises(S3Error, match="session socket only") as e:
        decode_descriptor(body)  # the gateway's and the data endpoint's decode
    assert e.value.code is ErrorCode.KVInvalidDescriptor and e.value.extra["Field"] == "flags"


def test_an_unknown_reference_asks_for_the_keys():
    body = encode_descriptor(_descriptor(_keys(4), key_ref=REF, keys_by_ref=True))
    with pytest.raises(S3Error) as e:
        decode_descriptor(body, named_keys=lambda ref: None)
    assert e.value.code is ErrorCode.KVUnknownKeyList and e.value.extra["Field"] == "key_ref"


def test_a_reference_naming_another_count_of_keys_is_refused():
    body = encode_descriptor(_descriptor(_keys(4), key_ref=REF, keys_by_ref=True))
    with pytest.raises(S3Error, match="names 5 keys, the descriptor declares 4"):
        decode_descriptor(body, named_keys=lambda ref: _keys(5))


@pytest.mark.parametrize("edit, message", [
    (lambda body: body + b"x", "1 bytes follow the key list reference"),
    (lambda body: body[:-1], "truncated"),
])
def test_a_reference_with_bytes_missing_or_left_over_is_refused(edit, message):
    body = encode_descriptor(_descriptor(_keys(4), key_ref=REF, keys_by_ref=True))
    with pytest.raises(S3Error, match=message):
        decode_descriptor(edit(body), named_keys=lambda ref: _keys(4))


def test_a_reference_beside_a_key_prefix_or_another_key_flag_is_refused():
    body = bytearray(encode_descriptor(_descriptor(_keys(4), key_ref=REF, keys_by_ref=True)))
    fields = list(HEAD.unpack_from(body))
    fields[-1] |= DescriptorFlag.KEY_LIST_NAMED
    HEAD.pack_into(body, 0, *fields)
    with pytest.raises(S3Error, match="KEY_LIST_REF carries the reference alone"):
        decode_descriptor(bytes(body), named_keys=lambda ref: _keys(4))


@pytest.mark.parametrize("bad", [dict(key_ref=b"short"), dict(keys_by_ref=True)])
def test_a_bad_reference_is_refused_when_encoding(bad):
    with pytest.raises(S3Error, match="key_ref"):
        encode_descriptor(dataclasses.replace(_descriptor(_keys(2)), **bad))
