"""The descriptor's first layer (a resumed http kv-get): carried exactly beside the load budget, refused out of range
or on a transport the server writes into, and the direct grant that names the peer a client may resume away from."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.data_ticket import DirectGrant
from protocol.errors import S3Error
from protocol.wire import Descriptor, Target, TransportKind, decode_descriptor, encode_descriptor

KEYS = ["ns/a", "ns/b", "ns/c"]
LAYERS = 5


def _descriptor(first: int, budget: float = 0.0, transport: TransportKind = TransportKind.HTTP) -> Descriptor:
    return Descriptor(KEYS, LAYERS, 32, 64, Target(transport, length=3 * LAYERS * 64), load_budget_s=budget, first_layer=first)


@given(st.integers(0, LAYERS - 1), st.sampled_from([0.0, 0.25]))
def test_a_first_layer_round_trips_beside_the_load_budget(first, budget):
    d = _descriptor(first, budget)
    assert decode_descriptor(encode_descriptor(d)) == d


def test_layer_zero_sends_no_field():
    assert len(encode_descriptor(_descriptor(2))) == len(encode_descriptor(_descriptor(0))) + 4


@pytest.mark.parametrize("bad", [LAYERS, LAYERS + 7, -1])
def test_a_first_layer_outside_the_layers_is_refused_naming_the_field(bad):
    with pytest.raises(S3Error, match="first_layer"):
        encode_descriptor(_descriptor(bad))


@pytest.mark.parametrize("bad", [0, LAYERS])
def test_a_flagged_first_layer_of_zero_or_past_the_end_is_refused(bad):
    one, two = encode_descriptor(_descriptor(1)), encode_descriptor(_descriptor(2))
    at = next(i for i, (x, y) in enumerate(zip(one, two)) if x != y)  # where the field sits (after the key prefix)
    data = bytearray(one)
    struct.pack_into("<I", data, at, bad)
    with pytest.raises(S3Error, match="first_layer"):
        decode_descriptor(bytes(data))


def test_a_first_layer_on_shared_memory_is_refused():
    data = encode_descriptor(_descriptor(1, transport=TransportKind.SHM))
    with pytest.raises(S3Error, match="FIRST_LAYER needs the http transport"):
        decode_descriptor(data)


def test_a_grant_names_its_peer_and_stall_bound_and_older_grants_read_as_the_node_itself():
    g = DirectGrant("127.0.0.1:1", "t", 30.0, "b", 5.0)
    assert DirectGrant.from_json(g.to_json()) == g
    assert DirectGrant.from_json({"endpoint": "127.0.0.1:1", "ticket": "t", "expires_in_s": 3}) == DirectGrant("127.0.0.1:1", "t", 3.0)
    for bad in ({"peer": 3}, {"stall_s": -1}, {"stall_s": True}):
        with pytest.raises(S3Error, match="peer"):
            DirectGrant.from_json({"endpoint": "e:1", "ticket": "t", **bad})
