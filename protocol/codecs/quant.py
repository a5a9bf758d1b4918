"""Lossy stages: symmetric int8/int4 and fp8 (e4m3) with a scale per group (keys per channel, values per token).

Intermediate format: ``float32 absmax`` per group (key channels first, then value tokens), then the codes
(int8: one byte each; int4: two per byte, low nibble first, ``q + 8``; fp8: one e4m3 byte each).

Error bounds (``x`` an original element, ``A`` its group's largest ``|x|``, ``u`` the unit roundoff of the
output dtype: 2^-8 bfloat16, 2^-11 float16; ``q = 2^(bits-1) - 1``):

* int8/int4: rounding to the grid ``A/q`` errs by at most ``A/(2q)``, rounding back into the dtype by at
  most ``u·A``: ``|err| ≤ A·(1/(2q) + u)``. That is within the issue's ``A / 2^(bits-1)`` except int8
  into bfloat16, where the output rounding adds ``A/256`` to ``A/254`` (``≈ A/127.5``).
* fp8 e4m3: the group is scaled so ``A`` maps to 448; 3 mantissa bits round within 2^-4 relative
  (subnormals within 2^-10 absolute of 448): ``|err| ≤ A·(2^-4 + u)``.

Each bound adds ``A·2^-20`` for float32 arithmetic. Non-finite inputs are refused (no scale holds them).
"""

from __future__ import annotations

import numpy as np

from .base import DTYPES, FLOAT32_SLACK, CodecError, SliceLayout, dtype_bytes, from_float32, scratch, to_float32


def _planes(values: np.ndarray, layout: SliceLayout) -> np.ndarray:
    return values.reshape(layout.planes, layout.tokens, layout.channels)


def group_absmax(values: np.ndarray, layout: SliceLayout) -> np.ndarray:
    """The float32 absmax of every group: plane 0 per channel, plane 1 per token."""
    planes = np.abs(_planes(values, layout))
    parts = [planes[0].max(axis=0)]
    if layout.planes == 2:
        parts.append(planes[1].max(axis=1))
    return np.concatenate(parts).astype(np.float32)


def _broadcast(per_group: np.ndarray, layout: SliceLayout) -> np.ndarray:
    """Per-group values as an array shaped like the slice."""
    c = layout.channels
    out = np.empty((layout.planes, layout.tokens, c), np.float32)
    out[0] = per_group[:c][None, :]
    if layout.planes == 2:
        out[1] = per_group[c:][:, None]
    return out


def _scaled_into(codes: np.ndarray, per_group: np.ndarray, layout: SliceLayout) -> np.ndarray:
    """``codes × per-group factor`` as float32, for ``count`` slices at once (``codes`` count × elements,
    ``per_group`` count × groups): broadcast per key channel and value token, never materialising a per-element
    scale array (that made dequantising 10× slower)."""
    c, count = layout.channels, codes.shape[0]
    q = codes.reshape(count, layout.planes, layout.tokens, c)
    vals = scratch("quant.vals", q.shape, np.float32)  # clobbered by _store: this thread's, reused
    np.multiply(q[:, 0], per_group[:, None, :c], out=vals[:, 0])
    if layout.planes == 2:
        np.multiply(q[:, 1], per_group[:, c:, None], out=vals[:, 1])
    return vals


def _store(vals: np.ndarray, dtype: str, out: np.ndarray) -> None:
    """float32 ``vals`` (a temporary: clobbered) rounded to nearest into ``out``'s dtype. bfloat16 rounds half away
    from zero (two in-place passes instead of four): still within half an ulp, as the bounds assume."""
    if dtype != "bfloat16":
        from_float32(vals, dtype, out)
        return
    u = vals.reshape(-1).view(np.uint32)
    np.add(u, 0x8000, out=u)
    np.right_shift(u, 16, out=u)
    out.view(np.uint16)[:] = u


def _finite(values: np.ndarray) -> None:
    if not np.isfinite(values).all():
        raise CodecError("values", "a lossy codec cannot encode inf or nan")


def _check_dtype(dtype: str) -> float:
    dtype_bytes(dtype)
    return DTYPES[dtype][1]


def _split(data: np.ndarray, layout: SliceLayout, codes: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` quantised slices back to back as (count × groups float32 absmax, count × ``codes`` code bytes)."""
    n = layout.groups() * 4
    if data.size != (n + codes) * count:
        expected = f"{n + codes}" if count == 1 else f"{count} × {n + codes}"
        raise CodecError("length", f"quantised slice{'s are' if count > 1 else ' is'} {data.size} bytes, expected {expected}")
    rows = data.reshape(count, n + codes)
    absmax = rows[:, :n].view(np.float32)
    if not np.isfinite(absmax).all() or (absmax < 0).any():
        raise CodecError("scales", "a group scale is negative or not finite")
    return absmax, rows[:, n:]


class IntQuantiser:
    """Symmetric integer quantisation to ``bits`` (8 or 4) with a float32 absmax per group."""

    def __init__(self, bits: int) -> None:
        self.bits, self.qmax = bits, (1 << (bits - 1)) - 1

    def _codes(self, layout: SliceLayout) -> int:
        return layout.elements if self.bits == 8 else (layout.elements + 1) // 2

    def encoded_size(self, dtype: str, layout: SliceLayout) -> int:
        return layout.groups() * 4 + self._codes(layout)

    def quantise(self, raw: np.ndarray, dtype: str, layout: SliceLayout) -> bytes:
        _check_dtype(dtype)
        values = to_float32(raw, dtype)
        _finite(values)
        absmax = group_absmax(values, layout)
        step = _broadcast(absmax, layout) / np.float32(self.qmax)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(step > 0, np.rint(_planes(values, layout) / np.where(step > 0, step, 1)), 0)
        q = np.clip(q, -self.qmax, self.qmax).astype(np.int8).reshape(-1)
        if self.bits == 4:
            nib = (q + 8).astype(np.uint8)
            if nib.size % 2:
                nib = np.append(nib, np.uint8(8))
            q = (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8)
        return absmax.tobytes() + q.tobytes()

    def dequantise(self, data: np.ndarray, dtype: str, layout: SliceLayout, out: np.ndarray, count: int = 1) -> None:
        _check_dtype(dtype)
        absmax, codes = _split(data, layout, self._codes(layout), count)
        if self.bits == 8:
            q = codes.view(np.int8)
        else:
            q = scratch("quant.int4", (count, codes.shape[1] * 2), np.int8)
            np.bitwise_and(codes, 0x0F, out=q[:, 0::2].view(np.uint8))
            np.right_shift(codes, 4, out=q[:, 1::2].view(np.uint8))
            np.subtract(q, 8, out=q)
            q = q[:, : layout.elements]
        if q.size and int(q.min()) < -self.qmax:  # the only codes outside ±q: -128 (int8), -8 (int4)
            raise CodecError("codes", f"a code lies outside ±{self.qmax}")
        _store(_scaled_into(q, absmax / np.float32(self.qmax), layout), dtype, out)

    def max_abs_error(self, absmax: float, dtype: str) -> float:
        return absmax * (1 / (2 * self.qmax) + _check_dtype(dtype) + FLOAT32_SLACK)


def _e4m3_table() -> np.ndarray:
    """The 127 non-negative finite e4m3 (fn) values, by code 0..126 (code 127 is NaN)."""
    codes = np.arange(127)
    exp, man = codes >> 3, codes & 7
    return np.where(exp == 0, man * 2.0 ** -9, (1 + man / 8) * 2.0 ** (exp - 7)).astype(np.float32)


E4M3 = _e4m3_table()
E4M3_MAX = float(E4M3[-1])  # 448
_E4M3_SIGNED = np.concatenate([E4M3, [np.nan], -E4M3, [np.nan]]).astype(np.float32)  # decode by code 0..255


class Fp8Quantiser:
    """fp8 e4m3 with a float32 absmax per group (the group's largest element maps to 448)."""

    bits = 8

    def encoded_size(self, dtype: str, layout: SliceLayout) -> int:
        return layout.groups() * 4 + layout.elements

    def quantise(self, raw: np.ndarray, dtype: str, layout: SliceLayout) -> bytes:
        _check_dtype(dtype)
        values = to_float32(raw, dtype)
        _finite(values)
        absmax = group_absmax(values, layout)
        scale = _broadcast(absmax, layout)
        with np.errstate(divide="ignore", invalid="ignore"):
            scaled = np.where(scale > 0, _planes(values, layout) * (np.float32(E4M3_MAX) / np.where(scale > 0, scale, 1)), 0)
        mag = np.minimum(np.abs(scaled).reshape(-1), np.float32(E4M3_MAX))
        hi = np.clip(np.searchsorted(E4M3, mag), 1, E4M3.size - 1)
        lo = hi - 1
        code = np.where(mag - E4M3[lo] <= E4M3[hi] - mag, lo, hi).astype(np.uint8)
        code |= (scaled.reshape(-1) < 0).astype(np.uint8) << 7
        return absmax.tobytes() + code.tobytes()

    def dequantise(self, data: np.ndarray, dtype: str, layout: SliceLayout, out: np.ndarray, count: int = 1) -> None:
        _check_dtype(dtype)
        absmax, codes = _split(data, layout, layout.elements, count)
        if ((codes & 0x7F) == 0x7F).any():
            raise CodecError("codes", "an fp8 code is NaN")
        values = np.take(_E4M3_SIGNED, codes, out=scratch("quant.fp8", codes.shape, np.float32))
        _store(_scaled_into(values, absmax / np.float32(E4M3_MAX), layout), dtype, out)

    def max_abs_error(self, absmax: float, dtype: str) -> float:
        return absmax * (2.0 ** -4 + _check_dtype(dtype) + FLOAT32_SLACK)
