"""The compressed chunk format: layer-addressable, strict, never mistaken for a raw chunk."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.codecs import CODECS, Codec, SliceLayout, codec_by_id, codec_by_name
from protocol.compressed_chunk import FIXED_HEADER_BYTES, ChunkHeader, ChunkShape, decode_header, encode_chunk, head_of, header_bytes, is_compressed
from protocol.errors import ErrorCode, S3Error


def _slices(layers: int, layout: SliceLayout, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    f = rng.normal(0, 1, (layers, layout.elements)).astype(np.float32)
    return [(f[i].view(np.uint32) >> 16).astype(np.uint16).tobytes() for i in range(layers)]


def _decode_all(key: str, obj: bytes, layers: int, s: int) -> list[bytes]:
    h = decode_header(key, obj[: head_of(obj)], len(obj), layers=layers, slice_bytes=s)
    outs = []
    for layer in range(h.layers):
        out = np.empty(s, np.uint8)
        h.decode_layer(key, layer, obj[h.offsets[layer] : h.offsets[layer] + h.lengths[layer]], out)
        outs.append(out.tobytes())
    return outs


@settings(max_examples=30, deadline=None)
@given(layers=st.integers(1, 6), tokens=st.sampled_from([1, 3, 16]), channels=st.sampled_from([1, 8, 64]),
       codec_id=st.sampled_from([c.id for c in CODECS.values() if not c.lossy]))
def test_lossless_chunks_round_trip_layer_by_layer(layers, tokens, channels, codec_id):
    layout = SliceLayout(2, tokens, channels)
    slices = _slices(layers, layout)
    obj = encode_chunk(slices, codec_by_id(codec_id), "bfloat16", layout)
    s = layout.nbytes("bfloat16")
    assert is_compressed(len(obj), layers, s)
    assert _decode_all("k", obj, layers, s) == slices


def test_never_exactly_raw_size():
    """A compressed object that would be L·S bytes gets one pad byte, so size alone says raw vs compressed."""
    layout = SliceLayout.flat(64)
    s = layout.nbytes("float32")

    class Fixed:  # an entropy stage whose output makes the object exactly L·S bytes without the pad
        def compress(self, data, itemsize):
            return b"x" * (s - header_bytes(1))

    obj = encode_chunk([b"\0" * s], Codec(250, "fixed", entropy=Fixed()), "float32", layout)
    assert len(obj) == s + 1 and is_compressed(len(obj), 1, s)
    assert obj[-1:] == b"\0"


def _refusal(obj: bytes, key: str = "bucket/prefix/c7", layers: int = 3, s: int | None = None) -> S3Error:
    with pytest.raises(S3Error) as e:
        h = decode_header(key, obj, len(obj), layers=layers, slice_bytes=s)
        for layer in range(h.layers):
            h.decode_layer(key, layer, obj[h.offsets[layer] : h.offsets[layer] + h.lengths[layer]], np.empty(h.slice_bytes, np.uint8))
    assert e.value.code == ErrorCode.KVInvalidCompressedChunk
    assert e.value.extra["Key"] == key and key in e.value.message
    return e.value


LAYOUT = SliceLayout(2, 16, 32)
S = LAYOUT.nbytes("bfloat16")


@pytest.fixture
def obj() -> bytearray:
    return bytearray(encode_chunk(_slices(3, LAYOUT), codec_by_name("zstd"), "bfloat16", LAYOUT))


def _poke(obj: bytearray, fmt: str, offset: int, value: int) -> bytes:
    struct.pack_into(fmt, obj, offset, value)
    return bytes(obj)


@pytest.mark.parametrize("fmt,offset,value,field", [
    ("<B", 8, 9, "version"),
    ("<B", 9, 99, "codec"),
    ("<B", 10, 7, "dtype"),
    ("<B", 11, 3, "layout"),
    ("<I", 20, 4, "layers"),
    ("<I", 24, 2, "pad"),
    ("<Q", 28, 12345, "decoded_bytes"),
    ("<Q", FIXED_HEADER_BYTES + 16, 1, "layers[1].offset"),
    ("<I", FIXED_HEADER_BYTES + 16 + 8, 1 << 30, "layers[1].length"),
    ("<I", FIXED_HEADER_BYTES + 2 * 16 + 12, 0xDEAD, "layers[2].crc32c"),
])
def test_inconsistent_headers_are_refused_naming_key_and_field(obj, fmt, offset, value, field):
    err = _refusal(_poke(obj, fmt, offset, value), s=S)
    assert err.extra["Field"] == field, err.message


def test_truncated_and_foreign_objects_are_refused(obj):
    assert _refusal(bytes(obj[:-1]), s=S).extra["Field"] == "layers[2].length"
    assert _refusal(bytes(obj) + b"\0", s=S).extra["Field"] == "length"
    assert _refusal(bytes(obj[:20]), s=S).extra["Field"] == "header"
    assert _refusal(b"\0" * 100, s=S).extra["Field"] == "magic"
    assert _refusal(bytes(obj), s=S * 2).extra["Field"] == "layout"  # decoded size is not the descriptor's S
    assert _refusal(bytes(obj), layers=4, s=S).extra["Field"] == "layers"


def test_corrupt_payload_is_refused_by_its_crc(obj):
    h: ChunkHeader = decode_header("k", bytes(obj), len(obj))
    obj[h.offsets[1] + 3] ^= 0x40
    assert _refusal(bytes(obj), s=S).extra["Field"] == "layers[1].crc32c"


def test_the_kv_put_shape_header_is_strict():
    shape = ChunkShape(4, "bfloat16", SliceLayout(2, 16, 256))
    assert ChunkShape.from_header(shape.to_header()) == shape and shape.chunk_bytes == 4 * 2 * 16 * 256 * 2
    for value, field in (("layers=4;planes=2;tokens=16;channels=8", "fields"), ("layers=4;planes=2;tokens=16;channels=8;dtype=int8", "dtype"),
                         ("layers=-1;planes=2;tokens=16;channels=8;dtype=float16", "layers"),
                         ("layers=4;planes=3;tokens=16;channels=8;dtype=float16", "planes"),
                         ("layers=4;layers=4;planes=2;tokens=16;channels=8;dtype=float16", "fields")):
        with pytest.raises(S3Error) as e:
            ChunkShape.from_header(value)
        assert e.value.code == ErrorCode.InvalidArgument and e.value.extra["Field"] == field, value


def test_the_client_decodes_flag_round_trips_over_http_and_rdma_and_is_refused_over_shm():
    from protocol.wire import Descriptor, Target, TransportKind, decode_descriptor, encode_descriptor

    for kind in (TransportKind.HTTP, TransportKind.RDMA):
        d = Descriptor(["a/1", "a/2"], 4, 16, 1024, Target(kind, length=2 * 4 * 1024), client_decodes=True)
        assert decode_descriptor(encode_descriptor(d)) == d
    assert not decode_descriptor(encode_descriptor(Descriptor(["a/1"], 4, 16, 1024, Target(length=4096)))).client_decodes
    shm = Descriptor(["a/1"], 4, 16, 1024, Target(TransportKind.SHM, length=4096), client_decodes=True)
    with pytest.raises(S3Error) as e:
        decode_descriptor(encode_descriptor(shm))
    assert e.value.extra["Field"] == "flags"


def test_the_decode_auto_flag_carries_the_clients_figures_and_is_refused_over_shm():
    from protocol.wire import Descriptor, Target, TransportKind, decode_descriptor, encode_descriptor

    http = Target(TransportKind.HTTP, length=2 * 4 * 1024)
    for target in (http, Target(TransportKind.RDMA, length=2 * 4 * 1024)):
        d = Descriptor(["a/1", "a/2"], 4, 16, 1024, target, (0.001,), load_budget_s=0.5, decode_auto=True, client_decode_workers=3,
                       client_decode_bytes_per_s=2.5e8, client_link_bytes_per_s=1.25e8)
        assert decode_descriptor(encode_descriptor(d)) == d  # after the load budget, before the keys
    for bad in (Descriptor(["a/1"], 4, 16, 1024, Target(TransportKind.SHM, length=4096), decode_auto=True, client_decode_workers=1),
                Descriptor(["a/1"], 4, 16, 1024, http, decode_auto=True, client_decode_workers=1, client_decodes=True)):
        with pytest.raises(S3Error) as e:
            decode_descriptor(encode_descriptor(bad))
        assert e.value.extra["Field"] == "flags"
    with pytest.raises(S3Error) as e:  # no workers to decode with
        encode_descriptor(Descriptor(["a/1"], 4, 16, 1024, http, decode_auto=True))
    assert e.value.extra["Field"] == "decode_auto"


def test_an_encoded_frames_slice_header_is_strict():
    from protocol.compressed_chunk import pack_slice_head, unpack_slice_head

    head = pack_slice_head(codec_by_name("int4+zstd"), "float16", SliceLayout(2, 16, 64))
    assert unpack_slice_head("k", head)[0].name == "int4+zstd"
    for bad, field in ((head[:5], "slice_header"), (bytes([77]) + head[1:], "codec"), (head[:1] + bytes([9]) + head[2:], "dtype"),
                       (head[:2] + bytes([3]) + head[3:], "layout")):
        with pytest.raises(S3Error) as e:
            unpack_slice_head("layer 2 chunk #5", bad)
        assert e.value.extra["Field"] == field and e.value.extra["Key"] == "layer 2 chunk #5"


def test_a_packed_layer_unpacks_into_its_slices_and_a_bad_table_is_refused():
    from protocol.compressed_chunk import SLICE_HEAD
    from protocol.packed_layer import ENTRY, fits, packed_bytes, unpack

    slices = [bytes([j]) * (SLICE_HEAD.size + 3 + j) for j in range(3)]
    data = bytearray(packed_bytes([len(x) for x in slices]))
    pos = ENTRY.size * 3
    for j, x in enumerate(slices):
        ENTRY.pack_into(data, ENTRY.size * j, len(x), 100 + j)
        data[pos : pos + len(x)] = x
        pos += len(x)
    got = unpack("layer 0", memoryview(bytes(data)), 3)
    assert [(bytes(v), crc) for v, crc in got] == [(x, 100 + j) for j, x in enumerate(slices)]
    two = 2 * (SLICE_HEAD.size + 10)
    assert fits(two, 2, SLICE_HEAD.size + 10 + ENTRY.size) and not fits(two, 2, SLICE_HEAD.size + 10 + ENTRY.size - 1)
    ENTRY.pack_into(data, ENTRY.size * 2, 10_000, 0)  # the last entry runs past the layer
    with pytest.raises(S3Error, match="packed entry 2"):
        unpack("layer 0", memoryview(bytes(data)), 3)
    with pytest.raises(S3Error, match="table"):
        unpack("layer 0", memoryview(bytes(data[:10])), 3)
