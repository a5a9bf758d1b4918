"""KV codecs, one registry keyed by id (one byte in the chunk header) and by name (config, kv-put).

API (what the node, the SDK and ``bench compression`` use):

* ``codec = codec_by_name("int8+zstd")`` or ``codec_by_id(5)`` — unknown ones raise :class:`CodecError`
  (``field`` = ``"codec"``); ``CODECS`` maps id -> :class:`Codec`, ``CODEC_NAMES`` name -> Codec.
* ``codec.encode(layer_slice, dtype, layout) -> bytes``: one layer slice of one chunk (exactly
  ``layout.nbytes(dtype)`` bytes, any buffer) to its encoded bytes. ``dtype`` is ``"bfloat16"``,
  ``"float16"`` or ``"float32"``; ``layout`` a :class:`SliceLayout` ``(planes, tokens, channels)``:
  the KV_L2TD slice is ``SliceLayout(2, G, n_kv·d)`` (plane 0 keys, plane 1 values); an unknown
  shape is ``SliceLayout.flat(elements)``.
* ``codec.decode(blob, out, dtype, layout)``: decodes into ``out`` (a writable buffer of exactly
  ``layout.nbytes(dtype)`` bytes); corrupt input raises :class:`CodecError` naming the field. The two
  stages apart, for a pipeline: ``codec.decompress(blob, dtype, layout, mid)`` into a uint8 array of
  ``codec.intermediate_size(dtype, layout)`` bytes, then ``codec.dequantise(mid, dtype, layout, out)``
  (``count=n``: n slices back to back in ``mid`` and ``out`` at once, far fewer numpy calls per byte).
* ``codec.id``, ``codec.name``, ``codec.lossy``; ``codec.max_abs_error(absmax, dtype)``: the stated
  bound on ``|decoded - original|`` within a group whose largest ``|original|`` is ``absmax`` (0.0 for
  lossless codecs). Groups are key channels and value tokens (``quant.group_absmax``).

Codecs: ``none`` (0: stored), ``zstd`` (1: lossless, zstd over byte planes), ``int8`` (2), ``int4`` (3),
``fp8`` (4: e4m3) and ``int8+zstd`` (5), ``int4+zstd`` (6), ``fp8+zstd`` (7): a lossy stage followed by
the lossless one. Bounds and formats: :mod:`.quant`, :mod:`.entropy`. Ids are never reused.
"""

from __future__ import annotations

from .base import BATCH_BYTES, DTYPE_IDS, DTYPES, Codec, CodecError, SliceLayout, alike_runs
from .entropy import ZstdPlanes
from .quant import Fp8Quantiser, IntQuantiser, group_absmax

_PLANES, _WHOLE = ZstdPlanes(split=True), ZstdPlanes(split=False)
_INT8, _INT4, _FP8 = IntQuantiser(8), IntQuantiser(4), Fp8Quantiser()

NONE = Codec(0, "none")
CODECS: dict[int, Codec] = {c.id: c for c in (
    NONE,
    Codec(1, "zstd", entropy=_PLANES),
    Codec(2, "int8", quantiser=_INT8),
    Codec(3, "int4", quantiser=_INT4),
    Codec(4, "fp8", quantiser=_FP8),
    Codec(5, "int8+zstd", quantiser=_INT8, entropy=_WHOLE),
    Codec(6, "int4+zstd", quantiser=_INT4, entropy=_WHOLE),
    Codec(7, "fp8+zstd", quantiser=_FP8, entropy=_WHOLE),
)}
CODEC_NAMES: dict[str, Codec] = {c.name: c for c in CODECS.values()}
LOSSLESS_NAMES: tuple[str, ...] = tuple(c.name for c in CODECS.values() if not c.lossy)


def codec_by_id(codec_id: int) -> Codec:
    try:
        return CODECS[codec_id]
    except KeyError:
        raise CodecError("codec", f"unknown codec id {codec_id}; known: {sorted(CODECS)}") from None


def codec_by_name(name: str) -> Codec:
    try:
        return CODEC_NAMES[name]
    except KeyError:
        raise CodecError("codec", f"unknown codec {name!r}; known: {', '.join(CODEC_NAMES)}") from None


__all__ = ["BATCH_BYTES", "CODECS", "CODEC_NAMES", "DTYPES", "DTYPE_IDS", "LOSSLESS_NAMES", "NONE", "Codec", "CodecError", "SliceLayout",
           "alike_runs", "codec_by_id", "codec_by_name", "group_absmax"]
