"""Frames streamed back (HTTP response body, and the storage-server RPC): ``DATA`` (payload bytes, ``http``
transport), ``LAYER`` (layer ℓ is complete in the destination, with its CRC32C), ``ENCODED`` (a stored compressed
slice for the client to decode), ``END`` (statistics, :class:`TransferStats`) and ``ERROR``."""

from __future__ import annotations

import dataclasses
import json
import struct
from dataclasses import dataclass, field
from enum import IntEnum

from ..errors import ErrorCode, S3Error


class FrameType(IntEnum):
    DATA = 1  # payload bytes for [offset, offset+length) of the destination (http transport)
    LAYER = 2  # layer `layer` is complete at [offset, offset+length); checksum = CRC32C (0 if the descriptor waived it)
    END = 3  # payload: JSON statistics
    ERROR = 4  # payload: JSON S3 error
    # One chunk's layer slice as stored (descriptor flag CLIENT_DECODES): payload = a slice header
    # (protocol.compressed_chunk.SLICE_HEAD) and the encoded bytes; it decodes to [offset, offset + S) of the
    # destination; checksum = CRC32C of the encoded bytes. The layer's LAYER frame then carries checksum 0.
    ENCODED = 5
    # rdma, the client decodes: layer `layer`'s slices as stored landed packed (protocol.packed_layer) at
    # [offset, offset+length) of the destination, in place of its raw bytes; sent instead of its LAYER frame.
    PACKED = 6


FRAME = struct.Struct("<BBHIQQI")  # type, flags, reserved, layer, offset, length, checksum
FRAME_SIZE = FRAME.size


@dataclass(frozen=True)
class Frame:
    type: FrameType
    layer: int = 0
    offset: int = 0
    length: int = 0
    checksum: int = 0

    @property
    def has_payload(self) -> bool:
        return self.type in (FrameType.DATA, FrameType.END, FrameType.ERROR, FrameType.ENCODED)


def pack_frame(ftype: FrameType, layer: int = 0, offset: int = 0, length: int = 0, checksum: int = 0) -> bytes:
    return FRAME.pack(ftype, 0, 0, layer, offset, length, checksum)


def unpack_frame(header: bytes | memoryview) -> Frame:
    t, _flags, _r, layer, offset, length, checksum = FRAME.unpack(header)
    try:
        ftype = FrameType(t)
    except ValueError:
        raise S3Error(ErrorCode.InternalError, f"unknown frame type {t} in KV stream") from None
    return Frame(ftype, layer, offset, length, checksum)


def json_frame(ftype: FrameType, obj: dict) -> bytes:
    payload = json.dumps(obj).encode()
    return pack_frame(ftype, length=len(payload)) + payload


@dataclass
class TransferStats:
    """The END frame: where the time went on the server, and what was decided."""

    request_id: str = ""
    mode: str = ""
    payload_bytes: int = 0
    storage_read_s: float = 0.0
    delivery_s: float = 0.0
    total_s: float = 0.0
    # From the start of the transfer to layer 0 being ready in the destination.
    first_layer_s: float = 0.0
    # Bandwidth allocation for layerwise transfers (scheduler): policy, rate, epoch.
    allocation: dict = field(default_factory=dict)
    # From the request's arrival to the first read: descriptor decode, pinning the chunks, planning.
    setup_s: float = 0.0
    # Layerwise: per layer [read start, read end, ready (its LAYER frame sent)], seconds from the start of the transfer.
    layer_timeline: list = field(default_factory=list)
    # Page-cache hit ratio of a sample of the chunks, and the bytes of cold chunks read ahead because of it.
    resident_sample: float = 1.0
    read_ahead_bytes: int = 0
    # Bytes read past the page cache (O_DIRECT) because the sampled chunks were mostly cold.
    direct_read_bytes: int = 0
    # Where the chunk bytes came from: "local" (this node's cache), "upstream", "peer:<node id>" (a cluster peer's cache).
    paths: dict = field(default_factory=dict)
    # Peer streams that failed part-way (broke, stalled, sent bad bytes) and were replaced by another path.
    failovers: int = 0
    # Chunks stored compressed: where they were decoded ("node" / "client"), why, and the bytes the link carried.
    decode_site: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """The fields as they are (every one is already JSON: numbers, strings, lists, dicts); the END frame encodes them at
        once. ``dataclasses.asdict`` deep-copied the per-layer timeline first (3% of a G64x64 kv-get's loop time, py-spy)."""
        return {name: getattr(self, name) for name in _STATS_FIELDS}

    @classmethod
    def from_json(cls, d: dict) -> "TransferStats":
        """The fields this side knows (a newer server may send more)."""
        known = _STATS_FIELDS
        return cls(**{k: v for k, v in d.items() if k in known})


_STATS_FIELDS = tuple(f.name for f in dataclasses.fields(TransferStats))  # every END frame's: looked up once
