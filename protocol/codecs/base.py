"""The codec contract: a layer slice's layout, its element types, and the two stages a codec is made of.

A codec is a lossy *quantiser* (or none) followed by a lossless *entropy* stage (or none). Both are
pure functions of bytes and the slice's :class:`SliceLayout`; the node's staged pipeline runs them
as separate stages (decompress, then dequantise), :meth:`Codec.decode` runs both.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

# dtype name -> (element bytes, unit roundoff of round-to-nearest into that dtype)
DTYPES: dict[str, tuple[int, float]] = {"bfloat16": (2, 2.0 ** -8), "float16": (2, 2.0 ** -11), "float32": (4, 2.0 ** -24)}
DTYPE_IDS: dict[str, int] = {"bfloat16": 0, "float16": 1, "float32": 2}
FLOAT32_SLACK = 2.0 ** -20  # float32 arithmetic in (de)quantisation, relative to the group's absmax


class CodecError(ValueError):
    """Bytes a codec cannot decode, or input it cannot encode; ``field`` names what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.index = 0  # of several slices decoded in one call, the one at fault


# Slices decoded per call up to this many raw bytes (Codec.decode_many, dequantise's ``count``; the SDK's decode pool
# batches its ENCODED frames to it): large enough that per-call numpy work and GIL hand-offs fade (16 × 64 KiB int8
# slices: 1.79 GB/s on one thread against 1.18 one at a time), small enough that a batch's temporaries stay bounded.
BATCH_BYTES = 512 << 10
SCRATCH_KEEP_BYTES = 16 << 20  # a thread keeps scratch buffers up to this many bytes in all; past it, allocated afresh
_scratch = threading.local()


def scratch(name: str, shape: int | tuple[int, ...], dtype: type = np.uint8) -> np.ndarray:
    """This thread's reusable buffer ``name`` as an array of ``shape`` (contents undefined), grown when too small.

    Decode temporaries of a batch (hundreds of KiB) allocated afresh each call came from pages the kernel had to fault
    in every time: on this VM a 512 KiB ``astype`` took 0.27 ms, four times the copy. A buffer is reused only by the
    thread that owns it, and each caller names its own, so one decode's temporaries never alias another's."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    bufs: dict[str, np.ndarray] | None = getattr(_scratch, "bufs", None)
    if bufs is None:
        bufs = _scratch.bufs = {}
    buf = bufs.get(name)
    if buf is None or buf.size < nbytes:
        buf = np.empty(max(nbytes, 1), np.uint8)
        kept = sum(b.size for n, b in bufs.items() if n != name)
        if kept + buf.size <= SCRATCH_KEEP_BYTES:  # what this thread keeps, all names together, stays bounded
            bufs[name] = buf
        else:
            bufs.pop(name, None)
    return buf[:nbytes].view(dtype).reshape(shape)


def alike_runs(kinds: Sequence[Hashable]) -> list[tuple[int, int]]:
    """(first index, count) of each run of equal neighbours in ``kinds`` that are not None: the slices one
    :meth:`Codec.decode_many` or ``dequantise(count=)`` call can take together (kind: codec id, dtype, layout)."""
    runs: list[tuple[int, int]] = []
    for i, kind in enumerate(kinds):
        if kind is None:
            continue
        if runs and i == runs[-1][0] + runs[-1][1] and kinds[i - 1] == kind:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def _at(index: int, fn, *args) -> None:
    """``fn(*args)`` for slice ``index`` of several: its CodecError says which."""
    try:
        fn(*args)
    except CodecError as e:
        e.index = index
        raise


@dataclass(frozen=True)
class SliceLayout:
    """One layer slice of one chunk as ``planes × tokens × channels`` elements, row-major.

    The KV_L2TD slice is ``(2, G, n_kv·d)``: plane 0 the keys, plane 1 the values. Quantisers group
    keys per channel (one scale per column of plane 0) and values per token (one per row of plane 1),
    as KIVI and CacheGen do. A slice of unknown shape is ``SliceLayout.flat(n)``: one group.
    """

    planes: int
    tokens: int
    channels: int

    def __post_init__(self) -> None:
        if self.planes not in (1, 2) or self.tokens < 1 or self.channels < 1:
            raise CodecError("layout", f"planes must be 1 or 2 and tokens, channels at least 1: {self}")

    @classmethod
    def flat(cls, elements: int) -> "SliceLayout":
        return cls(1, max(1, elements), 1)

    @property
    def elements(self) -> int:
        return self.planes * self.tokens * self.channels

    def nbytes(self, dtype: str) -> int:
        """S: the decoded size of the slice in bytes."""
        return self.elements * dtype_bytes(dtype)

    def groups(self) -> int:
        """Quantisation groups: a scale per key channel and per value token."""
        return self.channels + (self.tokens if self.planes == 2 else 0)


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPES[dtype][0]
    except KeyError:
        raise CodecError("dtype", f"{dtype!r} is not one of {', '.join(DTYPES)}") from None


def as_bytes(data: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """Any buffer as a flat uint8 array, without a copy."""
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, np.uint8)


def to_float32(raw: np.ndarray, dtype: str) -> np.ndarray:
    """The slice's elements (raw bytes in ``dtype``) as float32, exactly."""
    if dtype == "bfloat16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if dtype == "float16":
        return raw.view(np.float16).astype(np.float32)
    if dtype == "float32":
        return raw.view(np.float32)
    raise CodecError("dtype", f"{dtype!r} is not one of {', '.join(DTYPES)}")


def from_float32(values: np.ndarray, dtype: str, out: np.ndarray) -> None:
    """Round ``values`` to nearest (even) in ``dtype`` into ``out`` (uint8 bytes of the slice)."""
    if dtype == "bfloat16":
        u = values.astype(np.float32, copy=False).reshape(-1).view(np.uint32)
        rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16  # finite inputs only: quantisers refuse inf/nan
        out.view(np.uint16)[:] = rounded
    elif dtype == "float16":
        out.view(np.float16)[:] = values.reshape(-1)
    elif dtype == "float32":
        out.view(np.float32)[:] = values.reshape(-1)
    else:
        raise CodecError("dtype", f"{dtype!r} is not one of {', '.join(DTYPES)}")


class Quantiser(Protocol):
    """The lossy stage: raw elements <-> a fixed-size intermediate (scales and codes)."""

    bits: int

    def encoded_size(self, dtype: str, layout: SliceLayout) -> int: ...

    def quantise(self, raw: np.ndarray, dtype: str, layout: SliceLayout) -> bytes: ...

    def dequantise(self, data: np.ndarray, dtype: str, layout: SliceLayout, out: np.ndarray, count: int = 1) -> None: ...

    def max_abs_error(self, absmax: float, dtype: str) -> float: ...


class Entropy(Protocol):
    """The lossless stage: bytes <-> fewer bytes; ``itemsize`` lets it split byte planes."""

    def compress(self, data: np.ndarray, itemsize: int) -> bytes: ...

    def decompress(self, blob: np.ndarray, itemsize: int, out: np.ndarray) -> None: ...

    def decompress_many(self, blobs: Sequence[np.ndarray], itemsize: int, out: np.ndarray) -> None:
        """``len(blobs)`` slices back to back into ``out``; a corrupt one raises CodecError with its ``index``."""
        ...


@dataclass(frozen=True)
class Codec:
    """One registered codec: ``id`` (one byte in the chunk header), ``name`` (config and kv-put)."""

    id: int
    name: str
    quantiser: Quantiser | None = None
    entropy: Entropy | None = None

    @property
    def lossy(self) -> bool:
        return self.quantiser is not None

    def intermediate_size(self, dtype: str, layout: SliceLayout) -> int:
        """Bytes between the two stages (what the entropy stage decodes to)."""
        return self.quantiser.encoded_size(dtype, layout) if self.quantiser else layout.nbytes(dtype)

    def encode(self, data: bytes | bytearray | memoryview | np.ndarray, dtype: str, layout: SliceLayout) -> bytes:
        """One layer slice (``layout.nbytes(dtype)`` raw bytes) to its encoded bytes."""
        raw = as_bytes(data)
        if raw.size != layout.nbytes(dtype):
            raise CodecError("size", f"slice is {raw.size} bytes, layout {layout} of {dtype} is {layout.nbytes(dtype)}")
        if self.quantiser is not None:
            mid, itemsize = as_bytes(self.quantiser.quantise(raw, dtype, layout)), 1
        else:
            mid, itemsize = raw, dtype_bytes(dtype)
        return self.entropy.compress(mid, itemsize) if self.entropy is not None else mid.tobytes()

    def decompress(self, blob: bytes | memoryview | np.ndarray, dtype: str, layout: SliceLayout, out: np.ndarray) -> None:
        """Stage 1: the entropy stage into ``out`` (``intermediate_size`` bytes, uint8)."""
        src = as_bytes(blob)
        if out.size != self.intermediate_size(dtype, layout):
            raise CodecError("size", f"stage buffer is {out.size} bytes, expected {self.intermediate_size(dtype, layout)}")
        if self.entropy is not None:
            self.entropy.decompress(src, 1 if self.quantiser else dtype_bytes(dtype), out)
        elif src.size != out.size:
            raise CodecError("length", f"{self.name} slice is {src.size} bytes, expected {out.size}")
        else:
            out[:] = src

    def dequantise(self, mid: np.ndarray, dtype: str, layout: SliceLayout, out: np.ndarray, count: int = 1) -> None:
        """Stage 2: the intermediate into ``out`` (``layout.nbytes(dtype)`` bytes, uint8); ``count``: that many slices
        back to back in ``mid`` and in ``out``, dequantised together, BATCH_BYTES of output a pass. Per 64 KiB slice,
        a dozen numpy calls gave the GIL away and back a dozen times: two decode threads together ran at half one
        thread's speed (int8, 0.57 against 1.18 GB/s); 16 slices a call, 1.79 on one thread and 2.35 on two."""
        if self.quantiser is None:
            out[:] = mid
            return
        m, s = self.intermediate_size(dtype, layout), layout.nbytes(dtype)
        if mid.size != count * m:
            raise CodecError("length", f"quantised slice{'s are' if count > 1 else ' is'} {mid.size} bytes, expected "
                                       f"{f'{count} × ' if count > 1 else ''}{m}")
        if out.size != count * s:
            raise CodecError("size", f"destination is {out.size} bytes, {count} slice(s) of layout {layout} of {dtype} are {count * s}")
        per = max(1, BATCH_BYTES // max(1, s))
        for first in range(0, count, per):  # at most BATCH_BYTES of output a call: the temporaries stay bounded
            n = min(per, count - first)
            part_mid, part_out = mid[first * m : (first + n) * m], out[first * s : (first + n) * s]
            try:
                self.quantiser.dequantise(part_mid, dtype, layout, part_out, n)
            except CodecError as e:
                for k in range(n if n > 1 else 0):  # which slice: CodecError.index
                    _at(first + k, self.quantiser.dequantise, part_mid[k * m : (k + 1) * m], dtype, layout, part_out[k * s : (k + 1) * s])
                e.index = first
                raise

    def decode(self, blob: bytes | memoryview | np.ndarray, out: memoryview | np.ndarray, dtype: str, layout: SliceLayout) -> None:
        """Both stages: ``blob`` decoded into ``out`` (exactly ``layout.nbytes(dtype)`` writable bytes)."""
        dest = as_bytes(out)
        if dest.size != layout.nbytes(dtype):
            raise CodecError("size", f"destination is {dest.size} bytes, layout {layout} of {dtype} is {layout.nbytes(dtype)}")
        if self.quantiser is None:
            self.decompress(blob, dtype, layout, dest)
            return
        mid = np.empty(self.intermediate_size(dtype, layout), np.uint8)
        self.decompress(blob, dtype, layout, mid)
        self.quantiser.dequantise(mid, dtype, layout, dest)

    def decode_many(self, blobs: Sequence[bytes | memoryview | np.ndarray], out: memoryview | np.ndarray, dtype: str,
                    layout: SliceLayout) -> None:
        """``len(blobs)`` slices decoded into ``out`` back to back: each one's entropy stage alone, the lossy stage once
        over all of them (see :meth:`dequantise`'s ``count``). A corrupt slice raises CodecError, ``index`` saying which."""
        dest, n, s = as_bytes(out), len(blobs), layout.nbytes(dtype)
        if dest.size != n * s:
            raise CodecError("size", f"destination is {dest.size} bytes, {n} slices of layout {layout} of {dtype} are {n * s}")
        if n == 0:
            return
        if self.quantiser is None and self.entropy is not None:
            self.entropy.decompress_many([as_bytes(b) for b in blobs], dtype_bytes(dtype), dest)
            return
        if self.quantiser is None:
            for k, blob in enumerate(blobs):
                _at(k, self.decompress, blob, dtype, layout, dest[k * s : (k + 1) * s])
            return
        m, per = self.intermediate_size(dtype, layout), max(1, BATCH_BYTES // max(1, s))
        for first in range(0, n, per):  # a batch of at most BATCH_BYTES of output at a time
            part = blobs[first : first + per]
            mid = scratch("mid", len(part) * m)
            for k, blob in enumerate(part):
                _at(first + k, self.decompress, blob, dtype, layout, mid[k * m : (k + 1) * m])
            try:
                self.dequantise(mid, dtype, layout, dest[first * s : (first + len(part)) * s], len(part))
            except CodecError as e:
                e.index += first
                raise

    def max_abs_error(self, absmax: float, dtype: str) -> float:
        """The largest |decoded - original| in a group whose largest |original| is ``absmax`` (0: lossless)."""
        return self.quantiser.max_abs_error(absmax, dtype) if self.quantiser else 0.0
