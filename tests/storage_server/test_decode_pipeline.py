"""The node's decode pipeline on its own: byte-exact pieces, stages that overlap, failures that wait for the rest."""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from awscrt.checksums import crc32c
from compressionsupport import kv_chunks, kv_layout

from client_sdk.compression import encode_layout_chunk
from protocol.compressed_chunk import decode_header, head_of, pack_chunk
from protocol.errors import ErrorCode, S3Error
from storage_server import decode_pipeline
from storage_server.decode_pipeline import DecodePipeline

LAYOUT = kv_layout(16)
S = LAYOUT.per_layer_chunk_bytes


@pytest.fixture
def stored(tmp_path):
    """12 chunks in files: raw, zstd and int8+zstd in turn; (fds, headers, keys, raw chunks)."""
    chunks = kv_chunks(LAYOUT, 12, seed=4)
    fds, headers, keys = [], [], []
    for j, chunk in enumerate(chunks):
        codec = ("none-raw", "zstd", "int8+zstd")[j % 3]
        data = chunk.tobytes() if codec == "none-raw" else encode_layout_chunk(memoryview(chunk), LAYOUT, codec)
        path = tmp_path / f"c{j}"
        path.write_bytes(data)
        fds.append(os.open(path, os.O_RDONLY))
        headers.append(None if codec == "none-raw" else decode_header(f"k{j}", data[: head_of(data)], len(data)))
        keys.append(f"k{j}")
    yield fds, headers, keys, chunks, tmp_path
    for fd in fds:
        os.close(fd)


def _pipeline(pool: ThreadPoolExecutor) -> DecodePipeline:
    return DecodePipeline(pool, 1, 1, 1, piece_bytes=2 * S)  # two chunks per piece: six pieces per layer


def test_layers_decode_exactly_with_their_crc(stored):
    fds, headers, keys, chunks, _ = stored
    with ThreadPoolExecutor(1) as pool:
        pipe = _pipeline(pool)
        for layer in range(LAYOUT.num_layers):
            dest = memoryview(bytearray(12 * S))
            crc = asyncio.run(pipe.decode(fds, [0] * 12, headers, keys, layer, 0, 12, S, dest, True))
            status = pipe.status()
            assert [status[st]["pieces"] for st in ("fetch", "decompress", "dequantise")] == [6 * (layer + 1)] * 3
            assert status["decompress"]["bytes"] == 12 * S * (layer + 1) and status["decompress"]["busy_s"] > 0
            assert crc == crc32c(dest)
            for j in range(12):
                got = np.frombuffer(dest[j * S : (j + 1) * S], np.uint8)
                want = chunks[j][layer * S : (layer + 1) * S]
                if j % 3 == 2:  # int8: within a step of the bf16 values, never byte-identical everywhere
                    assert np.abs(got.view(np.uint16).astype(int) - want.view(np.uint16).astype(int)).max() > 0
                else:
                    assert np.array_equal(got, want)
        pipe.close()


def test_a_piece_is_fetched_while_an_earlier_one_is_decompressed(stored, monkeypatch):
    """Stage overlap: piece 0's decompress waits until a later piece's fetch ran; a serial pipeline would never see it."""
    fds, headers, keys, _, _ = stored
    fetched_later = threading.Event()
    real_fetch, real_decompress = decode_pipeline._fetch, decode_pipeline._decompress
    overlapped = []

    def fetch(fds_, offsets, headers_, keys_, p, *rest):
        if p.a > 0:
            fetched_later.set()
        return real_fetch(fds_, offsets, headers_, keys_, p, *rest)

    def decompress(headers_, keys_, p, *rest):
        if p.a == 0:
            overlapped.append(fetched_later.wait(10))
        return real_decompress(headers_, keys_, p, *rest)

    monkeypatch.setattr(decode_pipeline, "_fetch", fetch)
    monkeypatch.setattr(decode_pipeline, "_decompress", decompress)
    with ThreadPoolExecutor(1) as pool:
        pipe = _pipeline(pool)
        dest = memoryview(bytearray(12 * S))
        asyncio.run(pipe.decode(fds, [0] * 12, headers, keys, 0, 0, 12, S, dest, False))
        pipe.close()
    assert overlapped == [True]


def test_a_corrupt_slice_fails_the_layer_naming_its_key_after_every_piece_stopped(stored, tmp_path):
    fds, headers, keys, _, _ = stored
    data = bytearray((tmp_path / "c4").read_bytes())
    h = headers[4]
    data[h.offsets[1] + 2] ^= 0x10
    (tmp_path / "c4").write_bytes(bytes(data))
    running = []
    with ThreadPoolExecutor(1) as pool:
        pipe = _pipeline(pool)
        dest = memoryview(bytearray(12 * S))
        with pytest.raises(S3Error) as e:
            asyncio.run(pipe.decode(fds, [0] * 12, headers, keys, 1, 0, 12, S, dest, False))
        running.append(pipe._free.qsize() if pipe._free is not None else -1)
        pipe.close()
    assert e.value.code == ErrorCode.KVInvalidCompressedChunk and e.value.extra["Key"] == "k4"
    assert "layers[1].crc32c" in e.value.message
    assert running == [len(pipe.slots)]  # every slot back: no stage still holds a buffer


def test_a_cancelled_decode_returns_only_once_no_stage_writes(stored, monkeypatch):
    """The client leaves mid-layer: the cancelled decode does not return while a stage thread still runs (it would
    write into a buffer the transport frees, or a slot the next piece takes)."""
    fds, headers, keys, _, _ = stored
    release, entered, running = threading.Event(), threading.Event(), []
    real_decompress = decode_pipeline._decompress

    def slow_decompress(*args):
        running.append(1)
        entered.set()
        release.wait(10)
        try:
            return real_decompress(*args)
        finally:
            running.pop()

    monkeypatch.setattr(decode_pipeline, "_decompress", slow_decompress)

    async def scenario(pipe):
        dest = memoryview(bytearray(12 * S))
        task = asyncio.ensure_future(pipe.decode(fds, [0] * 12, headers, keys, 0, 0, 12, S, dest, False))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 10)
        task.cancel()
        threading.Timer(0.3, release.set).start()  # the stage finishes a moment after the cancel
        with pytest.raises(asyncio.CancelledError):
            await task
        return list(running), pipe._free.qsize()

    with ThreadPoolExecutor(1) as pool:
        pipe = _pipeline(pool)
        still_running, free = asyncio.run(scenario(pipe))
        pipe.close()
    assert still_running == [] and free == len(pipe.slots)


def _store(tmp_path, chunks, codecs):
    fds, headers, keys = [], [], []
    for j, (chunk, codec) in enumerate(zip(chunks, codecs)):
        data = encode_layout_chunk(memoryview(chunk), LAYOUT, codec)
        (tmp_path / f"r{j}").write_bytes(data)
        fds.append(os.open(tmp_path / f"r{j}", os.O_RDONLY))
        headers.append(decode_header(f"r{j}", data[: head_of(data)], len(data)))
        keys.append(f"r{j}")
    return fds, headers, keys


def test_runs_of_chunks_stored_alike_decode_as_each_would_alone(tmp_path, monkeypatch):
    """Neighbours with one codec are dequantised in one call: every slice as its own header decodes it, across runs
    broken by another codec, a lossless chunk and a piece boundary."""
    from protocol.codecs import Codec

    codecs = ["int8"] * 5 + ["int4", "int4", "zstd", "int8+zstd", "int8+zstd", "fp8", "fp8"]
    chunks = kv_chunks(LAYOUT, len(codecs), seed=9)
    fds, headers, keys = _store(tmp_path, chunks, codecs)
    calls: list[int] = []
    real = Codec.dequantise
    monkeypatch.setattr(Codec, "dequantise", lambda self, mid, dtype, layout, out, count=1: (calls.append(count),
                                                                                           real(self, mid, dtype, layout, out, count))[1])
    try:
        with ThreadPoolExecutor(1) as pool:
            pipe = DecodePipeline(pool, 1, 1, 1, piece_bytes=4 * S)  # pieces of 4 chunks: the int8 run spans two
            for layer in range(LAYOUT.num_layers):
                dest = memoryview(bytearray(len(codecs) * S))
                calls.clear()
                asyncio.run(pipe.decode(fds, [0] * len(codecs), headers, keys, layer, 0, len(codecs), S, dest, False))
                # pieces 0-3, 4-7, 8-11: int8 x4 | int8, int4 x2 (zstd has no lossy stage) | int8+zstd x2, fp8 x2
                assert sorted(calls) == [1, 2, 2, 2, 4], calls
                for j, h in enumerate(headers):
                    with open(fds[j], "rb", closefd=False) as f:
                        f.seek(h.offsets[layer])
                        encoded = f.read(h.lengths[layer])
                    alone = np.empty(S, np.uint8)
                    h.decode_layer(keys[j], layer, encoded, alone)
                    assert bytes(dest[j * S : (j + 1) * S]) == alone.tobytes(), (codecs[j], j, layer)
            pipe.close()
    finally:
        for fd in fds:
            os.close(fd)


def test_a_bad_scale_inside_a_run_fails_the_layer_naming_that_chunks_key(tmp_path):
    """A scale that is negative (its slice's CRC made to match) in the third of five int8 neighbours: the one call
    over the run fails, and the error names the third chunk, not the run's first."""
    chunks = kv_chunks(LAYOUT, 5, seed=10)
    slices = [np.frombuffer(c, np.uint8).reshape(LAYOUT.num_layers, S) for c in chunks]
    fds, headers, keys = _store(tmp_path, chunks, ["int8"] * 5)
    layout, codec = headers[2].layout, headers[2].codec
    bad = bytearray(codec.encode(slices[2][0], "bfloat16", layout))
    bad[0:4] = np.float32(-1.0).tobytes()
    os.close(fds[2])
    others = [codec.encode(layer_slice, "bfloat16", layout) for layer_slice in slices[2][1:]]
    (tmp_path / "r2").write_bytes(pack_chunk([bytes(bad), *others], codec, "bfloat16", layout))
    fds[2] = os.open(tmp_path / "r2", os.O_RDONLY)
    data = (tmp_path / "r2").read_bytes()
    headers[2] = decode_header("r2", data[: head_of(data)], len(data))
    try:
        with ThreadPoolExecutor(1) as pool:
            pipe = DecodePipeline(pool, 1, 1, 1, piece_bytes=5 * S)
            with pytest.raises(S3Error) as e:
                asyncio.run(pipe.decode(fds, [0] * 5, headers, keys, 0, 0, 5, S, memoryview(bytearray(5 * S)), False))
            pipe.close()
    finally:
        for fd in fds:
            os.close(fd)
    assert e.value.code == ErrorCode.KVInvalidCompressedChunk and e.value.extra["Key"] == "r2"
    assert "layers[0].scales" in e.value.message



def test_a_layer_of_one_piece_runs_its_stages_in_one_job_and_meters_each(stored, monkeypatch):
    """Nothing to overlap with: fetch, decompress and dequantise on one thread, one after another (no hop between
    pools), every stage still metered; a layer of several pieces keeps its stages on their own pools."""
    fds, headers, keys, chunks, _ = stored
    threads: dict[str, set[int]] = {"fetch": set(), "decompress": set(), "dequantise": set()}
    for stage in threads:
        real = getattr(decode_pipeline, f"_{stage}")
        monkeypatch.setattr(decode_pipeline, f"_{stage}",
                            lambda *a, _real=real, _stage=stage: (threads[_stage].add(threading.get_ident()), _real(*a))[1])
    with ThreadPoolExecutor(1) as pool:
        whole = DecodePipeline(pool, 1, 1, 1, piece_bytes=12 * S)
        dest = memoryview(bytearray(12 * S))
        crc = asyncio.run(whole.decode(fds, [0] * 12, headers, keys, 2, 0, 12, S, dest, True))
        assert crc == crc32c(dest) and len(threads["fetch"] | threads["decompress"] | threads["dequantise"]) == 1
        assert [whole.status()[st]["pieces"] for st in threads] == [1, 1, 1]
        for j in (0, 1):  # raw and zstd: exact
            assert bytes(dest[j * S : (j + 1) * S]) == chunks[j][2 * S : 3 * S].tobytes()
        whole.close()
        for stage in threads.values():
            stage.clear()
        pieces = _pipeline(pool)
        asyncio.run(pieces.decode(fds, [0] * 12, headers, keys, 2, 0, 12, S, memoryview(bytearray(12 * S)), False))
        assert threads["fetch"].isdisjoint(threads["decompress"] | threads["dequantise"])
        pieces.close()
