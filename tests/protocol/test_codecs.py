"""Every registered codec round-trips: lossless bit-exact, lossy within its stated per-group bound."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.codecs import CODECS, CodecError, SliceLayout, codec_by_id, codec_by_name, group_absmax
from protocol.codecs.base import from_float32, to_float32

DTYPES = ("bfloat16", "float16", "float32")


def _raw(seed: int, dtype: str, layout: SliceLayout, spread: float, outliers: bool) -> np.ndarray:
    """KV-like finite elements of ``dtype`` as raw bytes: normal, per-channel magnitudes, optional outliers and zeros."""
    rng = np.random.default_rng(seed)
    values = rng.normal(0, 1, (layout.planes, layout.tokens, layout.channels)).astype(np.float32)
    values *= np.exp(rng.normal(0, spread, layout.channels)).astype(np.float32)
    if outliers:
        values.reshape(-1)[rng.integers(0, values.size, max(1, values.size // 50))] *= 1e3
        values.reshape(-1)[rng.integers(0, values.size, max(1, values.size // 20))] = 0
    if dtype == "float16":
        values = np.clip(values, -6e4, 6e4)
    out = np.empty(layout.nbytes(dtype), np.uint8)
    from_float32(values, dtype, out)
    return out


layouts = st.builds(SliceLayout, st.sampled_from([1, 2]), st.integers(1, 40), st.integers(1, 70))


@settings(max_examples=60, deadline=None)
@given(layout=layouts, dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**32 - 1), spread=st.floats(0, 3),
       outliers=st.booleans(), codec_id=st.sampled_from(sorted(CODECS)))
def test_round_trip_within_bound(layout, dtype, seed, spread, outliers, codec_id):
    codec = codec_by_id(codec_id)
    raw = _raw(seed, dtype, layout, spread, outliers)
    blob = codec.encode(raw, dtype, layout)
    out = np.full(raw.size, 0xAB, np.uint8)
    codec.decode(blob, memoryview(out), dtype, layout)
    if not codec.lossy:
        assert out.tobytes() == raw.tobytes()
        assert codec.max_abs_error(1.0, dtype) == 0.0
        return
    x = to_float32(raw, dtype).astype(np.float64).reshape(layout.planes, layout.tokens, layout.channels)
    err = np.abs(to_float32(out, dtype).astype(np.float64).reshape(x.shape) - x)
    absmax = group_absmax(x.astype(np.float32).reshape(-1), layout).astype(np.float64)
    bound = np.array([codec.max_abs_error(a, dtype) for a in absmax])
    c = layout.channels
    assert (err[0] <= bound[:c][None, :]).all(), "keys: per-channel bound exceeded"
    if layout.planes == 2:
        assert (err[1] <= bound[c:][:, None]).all(), "values: per-token bound exceeded"


@pytest.mark.parametrize("name,bits", [("int8", 8), ("int4", 4), ("int8+zstd", 8), ("int4+zstd", 4)])
def test_int_bound_is_the_issues_except_bf16_output_rounding(name, bits):
    """The stated bound is scale/2^(bits-1) (scale: the group's absmax) for float16; bfloat16 adds its rounding."""
    codec = codec_by_name(name)
    assert codec.max_abs_error(1.0, "float16") <= 1 / 2 ** (bits - 1)
    assert codec.max_abs_error(1.0, "bfloat16") <= 1 / 2 ** (bits - 1) + 2 ** -8


def test_bound_is_tight_enough_to_catch_a_wrong_scale():
    """A decoder that used the wrong group's scale breaks the bound the test checks (the test can fail)."""
    layout = SliceLayout(2, 8, 16)
    raw = _raw(1, "float16", layout, 2.0, False)
    codec = codec_by_name("int8")
    blob = bytearray(codec.encode(raw, "float16", layout))
    blob[0:4], blob[4:8] = blob[4:8], blob[0:4]  # swap two key-channel scales
    out = np.empty(raw.size, np.uint8)
    codec.decode(bytes(blob), out, "float16", layout)
    x = to_float32(raw, "float16").reshape(2, 8, 16)
    err = np.abs(to_float32(out, "float16").reshape(2, 8, 16) - x)
    absmax = group_absmax(x.reshape(-1), layout)
    assert (err[0, :, 0] > codec.max_abs_error(float(absmax[0]), "float16")).any() or \
           (err[0, :, 1] > codec.max_abs_error(float(absmax[1]), "float16")).any()


def test_lossless_compresses_bf16_kv():
    layout = SliceLayout(2, 64, 256)
    raw = _raw(3, "bfloat16", layout, 1.0, False)
    assert len(codec_by_name("zstd").encode(raw, "bfloat16", layout)) < 0.8 * raw.size


@settings(max_examples=40, deadline=None)
@given(layout=layouts, dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**32 - 1), count=st.integers(1, 9),
       codec_id=st.sampled_from(sorted(c.id for c in CODECS.values() if c.lossy)))
def test_dequantising_slices_together_gives_each_slice_what_it_gives_alone(layout, dtype, seed, count, codec_id):
    """``count`` intermediates back to back, one call: byte for byte what one call per slice writes."""
    codec = codec_by_id(codec_id)
    size, s = codec.intermediate_size(dtype, layout), layout.nbytes(dtype)
    mids = np.empty(count * size, np.uint8)
    for k in range(count):
        codec.decompress(codec.encode(_raw(seed + k, dtype, layout, 1.0, k % 2 == 1), dtype, layout), dtype, layout,
                         mids[k * size : (k + 1) * size])
    alone, together = np.zeros(count * s, np.uint8), np.ones(count * s, np.uint8)
    for k in range(count):
        codec.dequantise(mids[k * size : (k + 1) * size], dtype, layout, alone[k * s : (k + 1) * s])
    codec.dequantise(mids, dtype, layout, together, count)
    assert together.tobytes() == alone.tobytes()


@settings(max_examples=40, deadline=None)
@given(layout=layouts, dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**32 - 1), count=st.integers(1, 6),
       codec_id=st.sampled_from(sorted(CODECS)))
def test_decoding_slices_together_gives_each_slice_what_it_gives_alone(layout, dtype, seed, count, codec_id):
    """``decode_many``, every codec (lossless ones interleave their byte planes once for all slices): byte for byte
    what ``decode`` gives each slice."""
    codec, s = codec_by_id(codec_id), layout.nbytes(dtype)
    blobs = [codec.encode(_raw(seed + k, dtype, layout, 1.0, k % 2 == 1), dtype, layout) for k in range(count)]
    alone, together = np.zeros(count * s, np.uint8), np.ones(count * s, np.uint8)
    for k, blob in enumerate(blobs):
        codec.decode(blob, alone[k * s : (k + 1) * s], dtype, layout)
    codec.decode_many(blobs, together, dtype, layout)
    assert together.tobytes() == alone.tobytes()


@pytest.mark.parametrize("name", ["zstd", "int8+zstd", "none"])
def test_a_corrupt_slice_among_others_is_the_one_named(name):
    codec, layout, dtype = codec_by_name(name), SliceLayout(2, 8, 16), "bfloat16"
    blobs = [codec.encode(_raw(k, dtype, layout, 1.0, False), dtype, layout) for k in range(4)]
    blobs[2] = blobs[2][:-2]
    with pytest.raises(CodecError) as e:
        codec.decode_many(blobs, np.empty(4 * layout.nbytes(dtype), np.uint8), dtype, layout)
    assert e.value.index == 2


@pytest.mark.parametrize("name", ["int8", "int4", "fp8"])
def test_slices_dequantised_together_refuse_one_bad_scale_or_a_wrong_length(name):
    codec, layout, dtype = codec_by_name(name), SliceLayout(2, 8, 16), "bfloat16"
    size = codec.intermediate_size(dtype, layout)
    mids = np.concatenate([np.frombuffer(codec.encode(_raw(k, dtype, layout, 1.0, False), dtype, layout), np.uint8)
                           for k in range(3)])
    out = np.empty(3 * layout.nbytes(dtype), np.uint8)
    with pytest.raises(CodecError) as e:
        codec.dequantise(mids[:-1], dtype, layout, out, 3)
    assert e.value.field == "length" and f"3 × {size}" in str(e.value)
    mids[size : size + 4].view(np.float32)[0] = -1.0  # the second slice's first scale
    with pytest.raises(CodecError) as e:
        codec.dequantise(mids, dtype, layout, out, 3)
    assert e.value.field == "scales" and e.value.index == 1


@pytest.mark.parametrize("name", ["zstd", "int8+zstd", "int4", "fp8"])
def test_corrupt_input_names_a_field(name):
    codec, layout = codec_by_name(name), SliceLayout(2, 16, 32)
    raw = _raw(2, "bfloat16", layout, 1.0, False)
    blob = codec.encode(raw, "bfloat16", layout)
    out = np.empty(raw.size, np.uint8)
    with pytest.raises(CodecError) as e:
        codec.decode(blob[:-3], out, "bfloat16", layout)
    assert e.value.field in {"length", "zstd", "decoded_size", "planes"}


def test_lossy_refuses_non_finite_and_unknown_names():
    layout = SliceLayout(1, 4, 4)
    raw = np.zeros(layout.nbytes("float16"), np.uint8)
    raw.view(np.float16)[3] = np.inf
    with pytest.raises(CodecError) as e:
        codec_by_name("int8").encode(raw, "float16", layout)
    assert e.value.field == "values"
    assert codec_by_name("zstd").encode(raw, "float16", layout)  # lossless keeps any bits
    with pytest.raises(CodecError):
        codec_by_name("brotli")
    with pytest.raises(CodecError):
        codec_by_id(200)


def test_registry_ids_and_names_are_unique_and_stable():
    assert {c.name: c.id for c in CODECS.values()} == {
        "none": 0, "zstd": 1, "int8": 2, "int4": 3, "fp8": 4, "int8+zstd": 5, "int4+zstd": 6, "fp8+zstd": 7}
    assert [c.name for c in CODECS.values() if not c.lossy] == ["none", "zstd"]


def test_config_knows_the_registrys_codecs():
    """protocol/config imports nothing of the project, so it names the codecs itself: the two lists stay equal."""
    from protocol import config

    assert config.CODEC_NAMES == tuple(c.name for c in CODECS.values())
    assert config.LOSSLESS_CODECS == tuple(c.name for c in CODECS.values() if not c.lossy)
    policy = config.CompressionConfig(lossy_buckets=("approx",))
    assert policy.allows("approx", "int4") and policy.allows("exact", "zstd") and not policy.allows("exact", "int8+zstd")
    with pytest.raises(config.ConfigError, match="compression.allowed_codecs"):
        config.CompressionConfig(allowed_codecs=("brotli",))
    assert config.CompressionConfig(bucket_codecs=("a:zstd",)).codec_for("a") == "zstd"
    assert config.CompressionConfig(bucket_codecs=("a:zstd",)).codec_for("b") == "none"
    with pytest.raises(config.ConfigError, match="compression.bucket_codecs.*lossy"):
        config.CompressionConfig(bucket_codecs=("a:int8",))
    assert config.CompressionConfig(bucket_codecs=("a:int8",), lossy_buckets=("a",)).codec_for("a") == "int8"


@pytest.mark.parametrize("name", ["zstd", "int8", "int4+zstd", "fp8"])
def test_a_run_longer_than_a_batch_is_decoded_in_batches_and_a_bad_slice_keeps_its_index(name, monkeypatch):
    """Seven slices with room for two a batch: four calls, the same bytes; slice 5's fault is reported as slice 5."""
    from protocol.codecs import base, entropy

    codec, layout, dtype = codec_by_name(name), SliceLayout(2, 8, 16), "bfloat16"
    s = layout.nbytes(dtype)
    monkeypatch.setattr(base, "BATCH_BYTES", 2 * s)
    monkeypatch.setattr(entropy, "BATCH_BYTES", 2 * s)
    blobs = [codec.encode(_raw(50 + k, dtype, layout, 1.0, False), dtype, layout) for k in range(7)]
    alone, together = np.zeros(7 * s, np.uint8), np.ones(7 * s, np.uint8)
    for k, blob in enumerate(blobs):
        codec.decode(blob, alone[k * s : (k + 1) * s], dtype, layout)
    codec.decode_many(blobs, together, dtype, layout)
    assert together.tobytes() == alone.tobytes()
    if codec.entropy is not None:
        blobs[5] = blobs[5][:-2]
    else:  # a scale that is not finite
        blobs[5] = np.float32(np.nan).tobytes() + blobs[5][4:]
    with pytest.raises(CodecError) as e:
        codec.decode_many(blobs, together, dtype, layout)
    assert e.value.index == 5


@pytest.mark.parametrize("name", ["int8", "int4", "fp8"])
def test_dequantising_more_slices_than_a_batch_gives_each_its_bytes_and_names_a_bad_one(name, monkeypatch):
    """The node's pipeline hands a whole piece (1 MiB) to dequantise; it works BATCH_BYTES at a time: here two slices."""
    from protocol.codecs import base

    codec, layout, dtype = codec_by_name(name), SliceLayout(2, 8, 16), "bfloat16"
    size, s = codec.intermediate_size(dtype, layout), layout.nbytes(dtype)
    monkeypatch.setattr(base, "BATCH_BYTES", 2 * s)
    mids = np.concatenate([np.frombuffer(codec.encode(_raw(70 + k, dtype, layout, 1.0, False), dtype, layout), np.uint8)
                           for k in range(7)])
    alone, together = np.zeros(7 * s, np.uint8), np.ones(7 * s, np.uint8)
    for k in range(7):
        codec.dequantise(mids[k * size : (k + 1) * size], dtype, layout, alone[k * s : (k + 1) * s])
    codec.dequantise(mids, dtype, layout, together, 7)
    assert together.tobytes() == alone.tobytes()
    mids[5 * size : 5 * size + 4].view(np.float32)[0] = np.inf
    with pytest.raises(CodecError) as e:
        codec.dequantise(mids, dtype, layout, together, 7)
    assert e.value.field == "scales" and e.value.index == 5
