"""A layer's slices as stored, packed into the layer's own place in the client's memory (rdma, the client decodes).

Over http a slice the client decodes travels as an ENCODED frame. Over rdma the node writes into the
client's registered memory instead, so it WRITEs layer ℓ's slices as stored into the place where the
raw layer ℓ would land — packed: a table of one ``(length u32, crc32c u32)`` entry per chunk (the
slice's bytes with their :data:`~protocol.compressed_chunk.SLICE_HEAD`, and the CRC32C of the encoded
bytes after it), then each chunk's slice in chunk order — and sends a PACKED frame for the layer. The
client copies the packed bytes out and decodes each slice into its place (chunk j at ``j·S``). A layer
whose packed form would not fit in its raw place (``N·S`` bytes) is decoded by the node instead.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from .compressed_chunk import SLICE_HEAD
from .errors import ErrorCode, S3Error

ENTRY = struct.Struct("<II")  # one chunk: its slice's bytes (head + encoded), the CRC32C of the encoded bytes


def packed_bytes(slice_bytes: Sequence[int]) -> int:
    """Bytes of a packed layer whose slices (each with its head) are ``slice_bytes`` long."""
    return ENTRY.size * len(slice_bytes) + sum(slice_bytes)


def fits(slices_bytes: int, chunks: int, chunk_bytes: int) -> bool:
    """Whether a layer of ``chunks`` slices of ``slices_bytes`` in all (heads included) packs into its raw place of ``N·S`` bytes."""
    return ENTRY.size * chunks + slices_bytes <= chunks * chunk_bytes


def unpack(what: str, data: memoryview, chunks: int) -> list[tuple[memoryview, int]]:
    """Each chunk's ``(slice with its head, CRC32C of the encoded bytes)`` from a packed layer; strict: an entry
    that does not fit raises ``InternalError`` naming ``what`` and the entry."""
    table = ENTRY.size * chunks
    if table > len(data):
        raise S3Error(ErrorCode.InternalError, f"{what}: a packed layer of {len(data)} bytes cannot hold its {chunks}-entry table")
    out, pos = [], table
    for j in range(chunks):
        length, crc = ENTRY.unpack_from(data, j * ENTRY.size)
        if length < SLICE_HEAD.size or pos + length > len(data):
            raise S3Error(ErrorCode.InternalError, f"{what}: packed entry {j}: {length} bytes at {pos} do not fit in {len(data)}")
        out.append((data[pos : pos + length], crc))
        pos += length
    return out
