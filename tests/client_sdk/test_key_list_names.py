"""The SDK's names for the key lists it sent on its session: the keys once, then the reference; plain descriptors for a
node that predates names."""

from __future__ import annotations

from client_sdk.key_list_names import KeyListNames
from protocol.wire import _DESC_HEAD as HEAD
from protocol.wire import KEY_LIST_REF_BYTES, Descriptor, DescriptorFlag, Target, TransportKind

KEYS = [f"ns/{i:032x}" for i in range(1, 41)]


def _flags(body: bytes) -> int:
    return HEAD.unpack_from(body)[-1]


def _descriptor(keys: list[str]) -> Descriptor:
    return Descriptor(keys, 4, 16, 8, Target(TransportKind.SHM, length=len(keys) * 32))


def test_keys_go_once_with_a_name_then_by_it():
    names = KeyListNames()
    first = names.encode(_descriptor(KEYS))
    again = names.encode(_descriptor(list(KEYS)))  # equal keys, another list
    assert _flags(first) & DescriptorFlag.KEY_LIST_NAMED and not _flags(first) & DescriptorFlag.KEY_LIST_REF
    assert _flags(again) & DescriptorFlag.KEY_LIST_REF and len(again) == HEAD.size + KEY_LIST_REF_BYTES
    ref = again[-KEY_LIST_REF_BYTES:]
    assert ref in first  # the name sent with the keys is the one sent alone


def test_changed_keys_and_a_refused_name_are_named_afresh():
    names = KeyListNames()
    names.encode(_descriptor(KEYS))
    changed = [*KEYS[:5], "ns/" + "f" * 32, *KEYS[6:]]  # same count, first and last key
    assert _flags(names.encode(_descriptor(changed))) & DescriptorFlag.KEY_LIST_NAMED
    assert _flags(names.encode(_descriptor(changed), by_ref=False)) & DescriptorFlag.KEY_LIST_NAMED


def test_a_node_that_predates_names_gets_plain_descriptors():
    names = KeyListNames()
    names.enabled = False
    body = names.encode(_descriptor(KEYS))
    assert not _flags(body) & (DescriptorFlag.KEY_LIST_NAMED | DescriptorFlag.KEY_LIST_REF)
