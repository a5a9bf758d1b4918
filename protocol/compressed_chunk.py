"""The compressed chunk object: a small header, then each layer slice encoded on its own.

A chunk object is *raw* (exactly ``L·S`` bytes, layer-major) or *compressed* (any other size): the
encoder pads one byte where a compressed object would come out at exactly ``L·S``, so the size
alone tells the two apart and raw chunks cost no extra read. A compressed chunk is an ordinary,
immutable object (``aws s3 ls`` lists it, a GET returns these bytes); layer ℓ is one range read
``[offset_ℓ, offset_ℓ + length_ℓ)`` once the header is known, so layer-by-layer delivery survives.

Header (little-endian)::

    magic    8s   ff ff ff ff 'OCKZ' (a NaN in every float dtype: no raw KV starts so)
    version  u8   1
    codec    u8   protocol.codecs id
    dtype    u8   protocol.codecs.DTYPE_IDS
    planes   u8   SliceLayout
    tokens   u32  SliceLayout (G)
    channels u32  SliceLayout (n_kv·d)
    layers   u32  L
    pad      u32  trailing bytes after the last layer (0 or 1)
    decoded  u64  L·S
    then per layer: offset u64, length u32, crc32c u32 (of the encoded slice)

Decoding is strict: every inconsistency raises :class:`S3Error` ``KVInvalidCompressedChunk`` naming the
key and the field (``extra`` ``Key`` and ``Field``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from awscrt.checksums import crc32c

from .codecs import DTYPE_IDS, Codec, CodecError, SliceLayout, codec_by_id
from .errors import ErrorCode, S3Error

MAGIC = b"\xff\xff\xff\xffOCKZ"
VERSION = 1
_HEAD = struct.Struct("<8sBBBBIIIIQ")
_LAYER = struct.Struct("<QII")
MAX_LAYERS = 1 << 16
_DTYPE_NAMES = {v: k for k, v in DTYPE_IDS.items()}


def header_bytes(layers: int) -> int:
    return _HEAD.size + layers * _LAYER.size


def bad_chunk(key: str, field: str, message: str) -> S3Error:
    return S3Error(ErrorCode.KVInvalidCompressedChunk, f"chunk {key!r}: {field}: {message}", extra={"Key": key, "Field": field})


@dataclass(frozen=True)
class ChunkHeader:
    """A validated header: where each encoded layer slice lies in the object and how to decode it."""

    codec: Codec
    dtype: str
    layout: SliceLayout
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    crcs: tuple[int, ...]
    object_bytes: int

    @property
    def layers(self) -> int:
        return len(self.offsets)

    @property
    def slice_bytes(self) -> int:
        """S: one decoded layer slice."""
        return self.layout.nbytes(self.dtype)

    def decode_layer(self, key: str, layer: int, encoded: bytes | memoryview | np.ndarray, out: memoryview | np.ndarray) -> None:
        """Check layer ``layer``'s CRC and decode it into ``out`` (S bytes); errors name ``key``."""
        self.decode_layers(key, layer, [encoded], out)

    def encoded_slices(self, data: memoryview | np.ndarray, first: int = 0, last: int | None = None, at: int = 0) -> list:
        """Views of layers first..last-1's encoded slices in ``data``, which holds the object from byte ``at`` on."""
        return [data[self.offsets[k] - at : self.offsets[k] - at + self.lengths[k]] for k in range(first, self.layers if last is None else last)]

    def decode_layers(self, key: str, first: int, encoded: Sequence[bytes | memoryview | np.ndarray], out: memoryview | np.ndarray) -> None:
        """Layers ``first``.. of this chunk (their encoded slices in ``encoded``), each CRC checked, decoded together into
        ``out`` (``len(encoded)`` × S bytes: :meth:`Codec.decode_many`); errors name ``key`` and the layer."""
        for k, blob in enumerate(encoded):
            if crc32c(blob) != self.crcs[first + k]:
                raise bad_chunk(key, f"layers[{first + k}].crc32c", "the encoded layer slice does not match its checksum")
        try:
            self.codec.decode_many(encoded, out, self.dtype, self.layout)
        except CodecError as e:
            raise bad_chunk(key, f"layers[{first + e.index}].{e.field}", str(e)) from None


def encode_chunk(layer_slices: list, codec: Codec, dtype: str, layout: SliceLayout) -> bytes:
    """A chunk's raw layer slices (each ``layout.nbytes(dtype)`` bytes) as a compressed chunk object."""
    return pack_chunk([codec.encode(s, dtype, layout) for s in layer_slices], codec, dtype, layout)


def pack_chunk(blobs: list[bytes], codec: Codec, dtype: str, layout: SliceLayout) -> bytes:
    """Encoded layer slices, as they are, behind the header that lists each one's offset, length and CRC32C."""
    n = len(blobs)
    raw_size = n * layout.nbytes(dtype)
    pos, table = header_bytes(n), []
    for blob in blobs:
        table.append(_LAYER.pack(pos, len(blob), crc32c(blob)))
        pos += len(blob)
    pad = 1 if pos == raw_size else 0  # never exactly L·S: the size alone says "compressed"
    head = _HEAD.pack(MAGIC, VERSION, codec.id, DTYPE_IDS[dtype], layout.planes, layout.tokens, layout.channels, n, pad, raw_size)
    return b"".join([head, *table, *blobs, b"\0" * pad])


def max_compressed_bytes(raw_bytes: int) -> int:
    """The largest compressed chunk of a raw ``raw_bytes``-byte chunk any codec writes (``none`` adds the header, zstd
    stores planes it cannot shrink, plus 21 bytes a layer): a bound for a reader that knows only L·S."""
    return raw_bytes + header_bytes(MAX_LAYERS) + 32 * MAX_LAYERS + 1


def is_compressed(size: int, layers: int, slice_bytes: int) -> bool:
    """Whether an object of ``size`` bytes must be a compressed chunk (a raw one is exactly L·S)."""
    return size != layers * slice_bytes


def decode_header(key: str, data: bytes | memoryview, object_bytes: int, *, layers: int | None = None,
                  slice_bytes: int | None = None) -> ChunkHeader:
    """The header at the start of ``data`` (at least :func:`header_bytes` of its layer count), checked
    against the object's size and, when given, the layer count and S the reader expects."""
    view = memoryview(data).cast("B")
    if len(view) < _HEAD.size:
        raise bad_chunk(key, "header", f"{len(view)} bytes cannot hold a {_HEAD.size}-byte header")
    magic, version, codec_id, dtype_id, planes, tokens, channels, n, pad, decoded = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise bad_chunk(key, "magic", "not a compressed chunk (and its size is not num_layers*per_layer_chunk_bytes)")
    if version != VERSION:
        raise bad_chunk(key, "version", f"{version} is not supported (this server reads {VERSION})")
    try:
        codec = codec_by_id(codec_id)
    except CodecError as e:
        raise bad_chunk(key, "codec", str(e)) from None
    if dtype_id not in _DTYPE_NAMES:
        raise bad_chunk(key, "dtype", f"unknown dtype id {dtype_id}")
    dtype = _DTYPE_NAMES[dtype_id]
    try:
        layout = SliceLayout(planes, tokens, channels)
    except CodecError as e:
        raise bad_chunk(key, "layout", str(e)) from None
    if not 1 <= n <= MAX_LAYERS:
        raise bad_chunk(key, "layers", f"{n} is not within 1..{MAX_LAYERS}")
    if layers is not None and n != layers:
        raise bad_chunk(key, "layers", f"{n} layers, the descriptor says num_layers = {layers}")
    s = layout.nbytes(dtype)
    if slice_bytes is not None and s != slice_bytes:
        raise bad_chunk(key, "layout", f"a layer slice decodes to {s} bytes, the descriptor says per_layer_chunk_bytes = {slice_bytes}")
    if decoded != n * s:
        raise bad_chunk(key, "decoded_bytes", f"{decoded}, but {n} layers of {s} bytes are {n * s}")
    if pad > 1:
        raise bad_chunk(key, "pad", f"{pad} is not 0 or 1")
    head = header_bytes(n)
    if len(view) < head:
        raise bad_chunk(key, "header", f"{len(view)} bytes cannot hold the {head}-byte header of {n} layers")
    offsets, lengths, crcs, pos = [], [], [], head
    for layer in range(n):
        offset, length, crc = _LAYER.unpack_from(view, _HEAD.size + layer * _LAYER.size)
        if offset != pos:
            raise bad_chunk(key, f"layers[{layer}].offset", f"{offset}, expected {pos} (slices are contiguous after the header)")
        if length < 1 or offset + length > object_bytes:
            raise bad_chunk(key, f"layers[{layer}].length", f"{length} bytes at {offset} do not fit in the {object_bytes}-byte object")
        offsets.append(offset)
        lengths.append(length)
        crcs.append(crc)
        pos += length
    if pos + pad != object_bytes:
        raise bad_chunk(key, "length", f"the layers end at {pos} (+{pad} pad), the object is {object_bytes} bytes")
    return ChunkHeader(codec, dtype, layout, tuple(offsets), tuple(lengths), tuple(crcs), object_bytes)


SLICE_HEAD = struct.Struct("<BBBII")  # an ENCODED frame's slice header: codec, dtype, planes, tokens, channels


def pack_slice_head(codec: Codec, dtype: str, layout: SliceLayout) -> bytes:
    return SLICE_HEAD.pack(codec.id, DTYPE_IDS[dtype], layout.planes, layout.tokens, layout.channels)


def unpack_slice_head(key: str, data: bytes | memoryview) -> tuple[Codec, str, SliceLayout]:
    """An ENCODED frame's slice header; errors name ``key`` (what the frame is for) and the field."""
    if len(data) < SLICE_HEAD.size:
        raise bad_chunk(key, "slice_header", f"{len(data)} bytes cannot hold the {SLICE_HEAD.size}-byte slice header")
    codec_id, dtype_id, planes, tokens, channels = SLICE_HEAD.unpack_from(data)
    try:
        codec = codec_by_id(codec_id)
        layout = SliceLayout(planes, tokens, channels)
    except CodecError as e:
        raise bad_chunk(key, e.field, str(e)) from None
    if dtype_id not in _DTYPE_NAMES:
        raise bad_chunk(key, "dtype", f"unknown dtype id {dtype_id}")
    return codec, _DTYPE_NAMES[dtype_id], layout


HEADER_KV_LAYOUT = "x-oc-kv-layout"  # kv-put: the chunks' shape, so a bucket's configured codec can be applied by the node


@dataclass(frozen=True)
class ChunkShape:
    """What a kv-put says of its raw chunks: L layer slices of ``layout`` in ``dtype`` (header
    ``x-oc-kv-layout: layers=L;planes=2;tokens=G;channels=C;dtype=bfloat16``)."""

    layers: int
    dtype: str
    layout: SliceLayout

    @property
    def chunk_bytes(self) -> int:
        return self.layers * self.layout.nbytes(self.dtype)

    def to_header(self) -> str:
        sl = self.layout
        return f"layers={self.layers};planes={sl.planes};tokens={sl.tokens};channels={sl.channels};dtype={self.dtype}"

    @classmethod
    def from_header(cls, value: str) -> "ChunkShape":
        """Strict: every field once, nothing else; errors name the header and the field."""
        def bad(field: str, why: str) -> S3Error:
            return S3Error(ErrorCode.InvalidArgument, f"{HEADER_KV_LAYOUT}: {field}: {why}", extra={"ArgumentName": HEADER_KV_LAYOUT, "Field": field})

        parts = dict(p.partition("=")[::2] for p in value.split(";"))
        if set(parts) != {"layers", "planes", "tokens", "channels", "dtype"} or len(parts) != len(value.split(";")):
            raise bad("fields", f"{value!r} must give layers, planes, tokens, channels and dtype once each")
        numbers = {}
        for name in ("layers", "planes", "tokens", "channels"):
            if not parts[name].isdigit() or not 0 < int(parts[name]) <= 1 << 24:
                raise bad(name, f"{parts[name]!r} is not a positive integer")
            numbers[name] = int(parts[name])
        if parts["dtype"] not in DTYPE_IDS:
            raise bad("dtype", f"{parts['dtype']!r} is not one of {', '.join(DTYPE_IDS)}")
        if numbers["layers"] > MAX_LAYERS:
            raise bad("layers", f"more than {MAX_LAYERS}")
        try:
            layout = SliceLayout(numbers["planes"], numbers["tokens"], numbers["channels"])
        except CodecError as e:
            raise bad("planes", str(e)) from None
        return cls(numbers["layers"], parts["dtype"], layout)


def head_of(data: bytes | memoryview) -> int:
    """Bytes of header in an object starting with ``data`` (at least the fixed part), 0 if it cannot say."""
    view = memoryview(data).cast("B")
    if len(view) < _HEAD.size or bytes(view[:8]) != MAGIC:
        return 0
    return header_bytes(min(_HEAD.unpack_from(view)[7], MAX_LAYERS))


FIXED_HEADER_BYTES = _HEAD.size
