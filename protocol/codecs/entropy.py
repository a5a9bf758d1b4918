"""Lossless stages: zstd over byte planes (raw bf16/fp16/fp32) or over the whole buffer (quantised codes).

Chosen by measurement (1 MiB synthetic bf16 KV slice, one core, this project's dev machine): byte planes
+ zstd level 1 gave ratio 1.44 at 1–3 GB/s decode; lz4 gave 1.00 (raw) / 1.13 (shuffled), so it saves
no bytes on KV; blosc2 (shuffle + zstd) gave the same ratio at 0.6–1.0 GB/s with a heavier install.
The exponent-carrying high byte of bf16 compresses ~2.6×, the mantissa byte not at all: each plane is
compressed on its own and stored raw when zstd does not shrink it, so decoding skips what cannot pay.

Format of one encoded buffer: ``u8 planes`` then per plane ``u8 method, u32 length`` (method 0 stored,
1 zstd), then the planes' bytes in order. ``planes`` is the element size for byte planes, 1 otherwise.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence

import numpy as np
import zstandard

from .base import BATCH_BYTES, CodecError, _at, scratch

_PLANE = struct.Struct("<BI")
STORED, ZSTD = 0, 1
_local = threading.local()


def _zstd() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    """Per-thread contexts: zstandard's are not thread-safe, and the decode stages run on pools."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        ctx = _local.ctx = (zstandard.ZstdCompressor(level=1), zstandard.ZstdDecompressor())
    return ctx


class ZstdPlanes:
    """zstd (level 1) over each byte plane of ``itemsize``-byte elements (``split=False``: one plane)."""

    def __init__(self, split: bool = True) -> None:
        self.split = split

    def compress(self, data: np.ndarray, itemsize: int) -> bytes:
        planes = itemsize if self.split else 1
        if data.size % planes:
            raise CodecError("size", f"{data.size} bytes is not a whole number of {planes}-byte elements")
        compressor = _zstd()[0]
        parts = [np.ascontiguousarray(data.reshape(-1, planes)[:, p]) for p in range(planes)] if planes > 1 else [data]
        head, body = [struct.pack("<B", planes)], []
        for part in parts:
            packed = compressor.compress(part.tobytes())
            method, payload = (ZSTD, packed) if len(packed) < part.size else (STORED, part.tobytes())
            head.append(_PLANE.pack(method, len(payload)))
            body.append(payload)
        return b"".join(head + body)

    def decompress(self, blob: np.ndarray, itemsize: int, out: np.ndarray) -> None:
        planes = itemsize if self.split else 1
        if planes == 2:  # 16-bit elements: the interleave of decompress_many
            self.decompress_many([blob], itemsize, out)
            return
        view = out.reshape(-1, planes) if planes > 1 else out
        for p, plane in enumerate(self._planes(blob, planes, out.size // planes)):
            if planes == 1:
                view[:] = plane
            else:
                view[:, p] = plane

    def decompress_many(self, blobs: Sequence[np.ndarray], itemsize: int, out: np.ndarray) -> None:
        """``len(blobs)`` slices back to back into ``out``: each one's planes decoded alone, the 16-bit interleave done
        once over them all (per slice it was four numpy calls and two temporaries, each giving the GIL away)."""
        planes, n = (itemsize if self.split else 1), len(blobs)
        size = out.size // n
        if planes != 2:
            for k, blob in enumerate(blobs):
                _at(k, self.decompress, blob, itemsize, out[k * size : (k + 1) * size])
            return
        per = max(1, BATCH_BYTES // max(1, size))
        for first in range(0, n, per):  # at most BATCH_BYTES of output at a time: the temporaries stay bounded
            part = blobs[first : first + per]
            lo, hi = scratch("planes.lo", (len(part), size // 2)), scratch("planes.hi", (len(part), size // 2))
            for k, blob in enumerate(part):
                _at(first + k, self._planes_into, blob, (lo[k], hi[k]))
            o16 = out[first * size : (first + len(part)) * size].view(np.uint16).reshape(len(part), size // 2)
            o16[:] = lo
            hi16 = scratch("planes.hi16", (len(part), size // 2), np.uint16)
            np.left_shift(hi, 8, out=hi16, dtype=np.uint16)
            np.bitwise_or(o16, hi16, out=o16)

    def _planes_into(self, blob: np.ndarray, dests: tuple[np.ndarray, ...]) -> None:
        for plane, dest in zip(self._planes(blob, len(dests), dests[0].size), dests):
            dest[:] = plane

    def _planes(self, blob: np.ndarray, planes: int, plane_bytes: int) -> list[np.ndarray]:
        """Each plane of ``blob``, decoded (or as stored), checked against the header and ``plane_bytes``."""
        if blob.size < 1 or blob[0] != planes:
            raise CodecError("planes", f"expected {planes} byte planes, header says {blob[0] if blob.size else 'nothing'}")
        pos = 1 + planes * _PLANE.size
        if blob.size < pos:
            raise CodecError("length", f"{blob.size} bytes cannot hold {planes} plane headers")
        spans = []
        for p in range(planes):
            method, length = _PLANE.unpack_from(blob, 1 + p * _PLANE.size)
            if method not in (STORED, ZSTD) or pos + length > blob.size:
                raise CodecError("length", f"plane {p}: method {method}, {length} bytes at {pos} overrun {blob.size}")
            spans.append((method, blob[pos : pos + length]))
            pos += length
        if pos != blob.size:
            raise CodecError("length", f"{blob.size - pos} trailing bytes after the planes")
        out = []
        for p, (method, payload) in enumerate(spans):
            if method == STORED:
                plane = payload
            else:
                try:
                    plane = np.frombuffer(_zstd()[1].decompress(payload, max_output_size=plane_bytes), np.uint8)
                except zstandard.ZstdError as e:
                    raise CodecError("zstd", f"plane {p}: {e}") from None
            if plane.size != plane_bytes:
                raise CodecError("decoded_size", f"plane {p} decodes to {plane.size} bytes, expected {plane_bytes}")
            out.append(plane)
        return out
