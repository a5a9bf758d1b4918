"""Compressed chunks in the node: their headers, read and checked before a kv-get is accepted, and the
checks of a kv-put that stores them (the decoding itself: :mod:`storage_server.decode_pipeline`).

A chunk object of exactly ``L·S`` bytes is raw; any other size must be a compressed chunk
(:mod:`protocol.compressed_chunk`) whose header agrees with the descriptor, else the kv-get is refused
before any byte moves: ``KVChunkSizeMismatch`` for a chunk that is not a compressed one,
``KVInvalidCompressedChunk`` naming the key and field for one whose header is inconsistent.
"""

from __future__ import annotations

import os

from awscrt.checksums import crc32c

from protocol.codecs import NONE, CodecError, SliceLayout, codec_by_name
from protocol.compressed_chunk import (
    FIXED_HEADER_BYTES,
    HEADER_KV_LAYOUT,
    MAGIC,
    ChunkHeader,
    ChunkShape,
    bad_chunk,
    decode_header,
    encode_chunk,
    head_of,
    is_compressed,
    pack_slice_head,
)
from protocol.config import CompressionConfig
from protocol.errors import ErrorCode, S3Error
from protocol.wire import Descriptor


def _pread_exact(fd: int, dest: memoryview, offset: int, what: str) -> None:
    n = os.preadv(fd, [dest], offset)
    if n != len(dest):
        raise S3Error(ErrorCode.InternalError, f"short read of {what}: {n} of {len(dest)} bytes")


def read_headers(d: Descriptor, fds: list[int], offsets: list[int], sizes: list[int]) -> list[ChunkHeader | None] | None:
    """Each chunk's validated header (None: a raw chunk); None when every chunk is raw (no read at all)."""
    s, layers = d.per_layer_chunk_bytes, d.num_layers
    if not any(is_compressed(size, layers, s) for size in sizes):
        return None
    headers: list[ChunkHeader | None] = []
    for j, (key, fd, offset, size) in enumerate(zip(d.chunk_keys, fds, offsets, sizes)):
        if not is_compressed(size, layers, s):
            headers.append(None)
            continue
        fixed = bytearray(min(size, FIXED_HEADER_BYTES))
        _pread_exact(fd, memoryview(fixed), offset, f"chunk {key!r}")
        if not (head := head_of(fixed)):
            raise S3Error(ErrorCode.KVChunkSizeMismatch,
                          f"chunk {key!r} is {size} bytes, expected num_layers*per_layer_chunk_bytes = {layers * s} "
                          "(and it is not a compressed chunk)",
                          extra={"Key": key, "ActualSize": str(size), "ExpectedSize": str(layers * s)})
        whole = bytearray(min(size, head))
        _pread_exact(fd, memoryview(whole), offset, f"chunk {key!r}")
        headers.append(decode_header(key, whole, size, layers=layers, slice_bytes=s))
    return headers


def stored_headers(keys: list[str], fds: list[int], offsets: list[int], sizes: list[int]) -> list[ChunkHeader | None]:
    """Each stored chunk's checked header, None for a raw one (no descriptor: the header's own shape)."""
    out: list[ChunkHeader | None] = []
    for key, fd, offset, size in zip(keys, fds, offsets, sizes):
        fixed = bytearray(min(size, FIXED_HEADER_BYTES))
        _pread_exact(fd, memoryview(fixed), offset, f"chunk {key!r}")
        if not (head := head_of(fixed)):
            out.append(None)
            continue
        whole = bytearray(min(size, head))
        _pread_exact(fd, memoryview(whole), offset, f"chunk {key!r}")
        out.append(decode_header(key, whole, size))
    return out


def check_puts(bucket: str, items: list[tuple[str, memoryview]], policy: CompressionConfig) -> None:
    """Refuse a kv-put batch holding a compressed chunk whose header is inconsistent (``KVInvalidCompressedChunk``)
    or whose codec this bucket does not allow (``KVCodecNotAllowed``); raw chunks pass unread."""
    for key, data in items:
        if len(data) < len(MAGIC) or bytes(data[: len(MAGIC)]) != MAGIC:
            continue
        h = decode_header(key, data, len(data))
        if not policy.allows(bucket, h.codec.name):
            raise S3Error(ErrorCode.KVCodecNotAllowed,
                          f"chunk {key!r}: codec {h.codec.name!r} is not allowed in bucket {bucket!r} "
                          f"(compression.allowed_codecs = {list(policy.allowed_codecs)}, lossy only in compression.lossy_buckets)",
                          extra={"Key": key, "Field": "codec", "Codec": h.codec.name})
        for layer in range(h.layers):
            encoded = data[h.offsets[layer] : h.offsets[layer] + h.lengths[layer]]
            if crc32c(encoded) != h.crcs[layer]:
                raise bad_chunk(key, f"layers[{layer}].crc32c", "the encoded layer slice does not match its checksum")


def encode_puts(items: list[tuple[str, memoryview]], shape: ChunkShape, codec: str) -> list[tuple[str, memoryview]]:
    """A kv-put's raw chunks (each exactly ``shape.chunk_bytes``) stored with the bucket's ``codec``; chunks that
    are compressed already stay as they are (their codec was checked)."""
    out = []
    s, c = shape.layout.nbytes(shape.dtype), codec_by_name(codec)
    for key, data in items:
        if bytes(data[: len(MAGIC)]) == MAGIC and len(data) != shape.chunk_bytes:
            out.append((key, data))
            continue
        if len(data) != shape.chunk_bytes:
            raise S3Error(ErrorCode.KVChunkSizeMismatch,
                          f"chunk {key!r} is {len(data)} bytes, the kv-put's {HEADER_KV_LAYOUT} says {shape.chunk_bytes}",
                          extra={"Key": key, "ActualSize": str(len(data)), "ExpectedSize": str(shape.chunk_bytes)})
        try:
            encoded = encode_chunk([data[i * s : (i + 1) * s] for i in range(shape.layers)], c, shape.dtype, shape.layout)
        except CodecError as e:
            raise S3Error(ErrorCode.InvalidArgument, f"chunk {key!r}: {codec} cannot encode it: {e}",
                          extra={"Key": key, "Field": e.field}) from None
        out.append((key, memoryview(encoded)))
    return out


def read_encoded(fds: list[int], offsets: list[int], headers: list[ChunkHeader | None], keys: list[str], layer: int, first: int, last: int,
                 s: int) -> list[tuple[bytes, int]]:
    """Layer ``layer`` of chunks first..last-1 as stored, for a client that decodes (descriptor flag CLIENT_DECODES):
    per chunk an ENCODED frame's payload (slice header + encoded bytes) and the CRC32C of the encoded bytes
    (the stored one for a compressed chunk; a raw chunk's slice goes as codec ``none``)."""
    out = []
    for j in range(first, last):
        h = headers[j]
        if h is None:
            head = pack_slice_head(NONE, "float16", SliceLayout.flat(s // 2))  # S = 2·G·n_kv·d·p is even
            buf = bytearray(len(head) + s)
            _pread_exact(fds[j], memoryview(buf)[len(head):], offsets[j] + layer * s, f"chunk {keys[j]!r}")
            buf[: len(head)] = head
            out.append((bytes(buf), crc32c(memoryview(buf)[len(head):])))
        else:
            head = pack_slice_head(h.codec, h.dtype, h.layout)
            buf = bytearray(len(head) + h.lengths[layer])
            _pread_exact(fds[j], memoryview(buf)[len(head):], offsets[j] + h.offsets[layer], f"chunk {keys[j]!r}")
            buf[: len(head)] = head
            out.append((bytes(buf), h.crcs[layer]))
    return out
