"""The SDK's decode pool: ENCODED slices decoded in batches of neighbours, each slice as it would decode alone."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from client_sdk import decoding
from client_sdk.decoding import LayerDecodes, SliceDecoder, decode_slices
from protocol.codecs import SliceLayout, codec_by_name
from protocol.codecs.base import from_float32
from protocol.compressed_chunk import pack_slice_head
from protocol.errors import ErrorCode, S3Error

LAYOUT, DTYPE = SliceLayout(2, 8, 16), "bfloat16"
S = LAYOUT.nbytes(DTYPE)


def _raw(seed: int) -> np.ndarray:
    out = np.empty(S, np.uint8)
    from_float32(np.random.default_rng(seed).normal(0, 1, LAYOUT.elements).astype(np.float32), DTYPE, out)
    return out


def _frame(codec: str, raw: np.ndarray) -> bytes:
    c = codec_by_name(codec)
    return pack_slice_head(c, DTYPE, LAYOUT) + c.encode(raw, DTYPE, LAYOUT)


def _alone(codec: str, raw: np.ndarray) -> bytes:
    c, out = codec_by_name(codec), np.empty(S, np.uint8)
    c.decode(c.encode(raw, DTYPE, LAYOUT), out, DTYPE, LAYOUT)
    return out.tobytes()


CODECS = ["int8", "int8", "int8", "none", "int4", "int4", "zstd", "fp8+zstd", "fp8+zstd", "int8"]


def test_a_batch_of_mixed_slices_decodes_each_as_it_would_alone():
    raws = [_raw(k) for k in range(len(CODECS))]
    dest = bytearray(len(CODECS) * S)
    decode_slices([(f"chunk #{k}", _frame(c, r), None) for k, (c, r) in enumerate(zip(CODECS, raws))], memoryview(dest))
    for k, (c, r) in enumerate(zip(CODECS, raws)):
        assert bytes(dest[k * S : (k + 1) * S]) == _alone(c, r), (k, c)


def test_a_bad_scale_in_the_middle_of_a_run_is_named():
    frames = [bytearray(_frame("int8", _raw(k))) for k in range(4)]
    head = len(pack_slice_head(codec_by_name("int8"), DTYPE, LAYOUT))
    frames[2][head : head + 4] = np.float32(np.inf).tobytes()  # the third slice's first scale
    with pytest.raises(S3Error) as e:
        decode_slices([(f"chunk #{k}", bytes(f), None) for k, f in enumerate(frames)], memoryview(bytearray(4 * S)))
    assert e.value.code == ErrorCode.KVInvalidCompressedChunk and e.value.extra["Key"] == "chunk #2"
    assert "scales" in e.value.message


def test_layer_decodes_batch_neighbours_and_split_where_slices_do_not_continue(monkeypatch):
    """Slices 0, 1, 2 then 5, 6 of a layer (3 and 4 came another way): two decode jobs, every slice in its place."""
    jobs = []
    real = decoding.decode_slices
    monkeypatch.setattr(decoding, "decode_slices", lambda slices, dest: (jobs.append(len(slices)), real(slices, dest)))
    raws = [_raw(20 + k) for k in range(7)]
    dest = memoryview(bytearray(7 * S))

    async def go():
        decodes = LayerDecodes(SliceDecoder(2), S)
        for k in (0, 1, 2, 5, 6):
            await decodes.start(f"chunk #{k}", _frame("int8", raws[k]), dest, k * S, None)
        await decodes.finish()
        decodes.decoder.close()
    asyncio.run(go())
    assert jobs == [3, 2]
    for k in (0, 1, 2, 5, 6):
        assert bytes(dest[k * S : (k + 1) * S]) == _alone("int8", raws[k])
    assert bytes(dest[3 * S : 5 * S]) == bytes(2 * S)


def test_a_full_batch_goes_to_the_pool_before_the_layer_ends(monkeypatch):
    monkeypatch.setattr(decoding, "BATCH_BYTES", 2 * S)
    raws = [_raw(40 + k) for k in range(5)]
    dest = memoryview(bytearray(5 * S))

    async def go():
        decodes = LayerDecodes(SliceDecoder(1), S)
        sizes = []
        for k in range(5):
            await decodes.start(f"chunk #{k}", _frame("int4", raws[k]), dest, k * S, None)
            sizes.append(len(decodes.pending))
        await decodes.finish()
        decodes.decoder.close()
        return sizes
    assert asyncio.run(go()) == [0, 1, 1, 2, 2]
    for k in range(5):
        assert bytes(dest[k * S : (k + 1) * S]) == _alone("int4", raws[k])


def test_a_failed_decode_is_raised_only_once_no_decode_of_the_layer_still_writes(monkeypatch):
    """The first batch is corrupt and the pool is full behind it: taking the next slice waits for it without raising,
    and finish() raises its error only once every other decode of the layer has ended."""
    import threading
    import time

    monkeypatch.setattr(decoding, "BATCH_BYTES", S)  # a batch per slice: the pool's bound (2 × 1 thread) is reached
    running, lock = [0], threading.Lock()
    real = decoding.decode_slices

    def slow(slices, dest):
        with lock:
            running[0] += 1
        try:
            time.sleep(0.05)
            return real(slices, dest)
        finally:
            with lock:
                running[0] -= 1
    monkeypatch.setattr(decoding, "decode_slices", slow)
    frames = [_frame("int8", _raw(60 + k)) for k in range(5)]
    frames[0] = frames[0][:-3]
    dest = memoryview(bytearray(5 * S))

    async def go():
        decodes = LayerDecodes(SliceDecoder(1), S)
        try:
            for k, frame in enumerate(frames):
                await decodes.start(f"chunk #{k}", frame, dest, k * S, None)
            await decodes.finish()
        except S3Error as e:
            with lock:
                return e, running[0]
        finally:
            await decodes.drain()
            decodes.decoder.close()
        return None, running[0]
    error, still_running = asyncio.run(go())
    assert error is not None and error.extra["Key"] == "chunk #0"
    assert still_running == 0
