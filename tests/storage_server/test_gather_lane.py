"""A warm shm kv-get of 2-8 MiB layers is gathered by two threads (the loop and a lane at idle priority); what lands is
byte for byte what one thread would have gathered, with the same per-layer CRC32C, and a client that leaves mid-way
leaves no lane copying into its region."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from awscrt.checksums import crc32c
from kvsupport import client, keys_for, make_chunks, reference, rpc, run
from support import boto_client, serving

from client_sdk import KVLayout
from storage_server.gather import INLINE_GATHER_BYTES
from storage_server.gather_lane import LANE_MIN_LAYER_BYTES, GatherLane, lane_split

# 32 chunks of 128 KiB per layer: 4 MiB layers, four of them.
LAYOUT = KVLayout(num_layers=4, chunk_tokens=256, kv_heads=8, head_dim=16, dtype="bfloat16")
N = 32


def test_the_lane_takes_a_third_of_each_2_to_8_mib_layer_and_only_with_a_core_to_spare():
    assert lane_split(64, 4 << 20, others_gathering=0, cores=2) == 22  # a third: the loop also sends the frames
    assert lane_split(3, LANE_MIN_LAYER_BYTES, 0, 2) == 1
    assert lane_split(64, 2 * INLINE_GATHER_BYTES, 0, 16) == 32  # the loop's part stays one inline gather
    assert lane_split(64, 4 << 20, others_gathering=1, cores=2) == 0  # another transfer keeps the other core busy
    assert lane_split(64, 4 << 20, 0, cores=1) == 0
    assert lane_split(64, LANE_MIN_LAYER_BYTES - 1, 0, 2) == 0  # 1 MiB layers: the lane lost (see gather_lane)
    assert lane_split(64, 2 * INLINE_GATHER_BYTES + 1, 0, 2) == 0  # the read pool splits these already
    assert lane_split(1, 4 << 20, 0, 2) == 0


def _arena(n: int, layers: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Mapped chunks as the executor sees them: one row per (chunk, layer), chunk j's layer ℓ at row first_rows[j] + ℓ."""
    rows = np.random.default_rng(seed).integers(0, 256, (n * layers, size), dtype=np.uint8)
    first_rows = (np.arange(n) * layers)[::-1].copy()  # chunks need not sit in prefix order in the arena
    return rows, first_rows


def test_a_lane_gathers_its_chunks_of_every_layer_with_their_crc():
    n, layers, size, split = 8, 3, 4096, 5
    rows, first_rows = _arena(n, layers, size, seed=1)
    dest = np.zeros((layers, split, size), np.uint8)

    async def scenario() -> list[int]:
        with ThreadPoolExecutor(1) as pool:
            lane = GatherLane(pool, rows, first_rows, split, range(1, layers), size, lambda layer: memoryview(dest[layer]).cast("B"), True)
            try:
                return [await lane.crc(layer) for layer in range(1, layers)]
            finally:
                await lane.close()

    crcs = run(scenario())
    for layer in range(1, layers):
        want = rows[first_rows[:split] + layer]
        assert np.array_equal(dest[layer], want)
        assert crcs[layer - 1] == crc32c(want.tobytes())
    assert not dest[0].any()  # only the layers it was given


def test_a_lane_that_fails_raises_in_the_transfer_that_waits_for_it():
    rows, first_rows = _arena(4, 2, 4096, seed=2)

    def no_buffer(layer: int) -> memoryview:
        raise MemoryError(f"no buffer for layer {layer}")

    async def scenario() -> None:
        with ThreadPoolExecutor(1) as pool:
            lane = GatherLane(pool, rows, first_rows, 2, range(2), 4096, no_buffer, False)
            try:
                await lane.crc(0)
            finally:
                await lane.close()

    try:
        run(scenario())
    except MemoryError as e:
        assert "layer 0" in str(e)
    else:
        raise AssertionError("a failed lane went unnoticed")


def test_a_warm_shm_kv_get_of_4_mib_layers_is_gathered_with_a_lane_byte_exact(tmp_path):
    keys, chunks = keys_for(LAYOUT, N, "lane"), make_chunks(LAYOUT, N, seed=5)
    want = reference(LAYOUT, chunks)
    with serving(tmp_path) as (proc, tenant, sock):
        boto_client(proc.endpoint, tenant).create_bucket(Bucket="lane")

        async def scenario() -> None:
            async with client(proc, tenant, "lane") as c:
                await c.put_chunks(keys, chunks, LAYOUT)
                before = rpc(str(sock), "status")["gather_lanes"]
                for verify in (True, False):  # with CRCs the lane's and the loop's join per layer; the client checks them
                    payload, stats = await c.fetch(keys, LAYOUT, "shm", mode="layerwise", verify=verify)
                    assert np.array_equal(payload, want)
                lanes = rpc(str(sock), "status")["gather_lanes"] - before
                assert lanes >= 1 or (os.cpu_count() or 1) < 2, "no warm kv-get of 4 MiB layers took a lane"
                # A client that leaves after the first layer: the lane is stopped before the region is given back,
                # and the next kv-get into the same memory is whole.
                async with c.fetch_layers(keys, LAYOUT, "shm", mode="layerwise") as layers:
                    async for _ in layers:
                        break
                payload, _ = await c.fetch(keys, LAYOUT, "shm", mode="layerwise", verify=True)
                assert np.array_equal(payload, want)
                status = rpc(str(sock), "status")
                assert status["transfers_active"] == [] and status["transfer_fds"]["held_fds"] == 0, status

        run(scenario())


def test_a_lane_the_loop_waits_on_is_promoted_to_a_normal_thread():
    """An idle-priority lane starved by busy cores would hold the transfer: past LANE_PATIENCE_S it runs at normal priority."""
    rows, first_rows = _arena(4, 2, 4096, seed=3)
    dest = np.zeros((2, 2, 4096), np.uint8)

    def slow_buffer(layer: int) -> memoryview:
        time.sleep(0.05)  # the lane lags far behind the loop's patience
        return memoryview(dest[layer]).cast("B")

    async def scenario() -> GatherLane:
        with ThreadPoolExecutor(1) as pool:
            lane = GatherLane(pool, rows, first_rows, 2, range(2), 4096, slow_buffer, False)
            try:
                await lane.crc(0)
                return lane
            finally:
                await lane.close()

    lane = run(scenario())
    assert lane.promoted
    assert np.array_equal(dest[0], rows[first_rows[:2]])


def test_a_cancelled_transfer_returns_only_once_its_lane_wrote_its_last_byte():
    rows, first_rows = _arena(4, 4, 4096, seed=4)
    dest = np.zeros((4, 2, 4096), np.uint8)
    entered, release = threading.Event(), threading.Event()

    def held_buffer(layer: int) -> memoryview:
        if layer == 1:
            entered.set()
            release.wait(30)  # the lane is mid-layer when the transfer is cancelled
        return memoryview(dest[layer]).cast("B")

    async def scenario() -> bool:
        with ThreadPoolExecutor(1) as pool:
            lane = GatherLane(pool, rows, first_rows, 2, range(4), 4096, held_buffer, False)
            lane.start()
            await asyncio.to_thread(entered.wait, 30)
            closing = asyncio.ensure_future(lane.close())
            await asyncio.sleep(0.05)
            returned_early = closing.done()
            release.set()
            await closing
            return returned_early

    assert not run(scenario()), "close() returned while the lane was still copying"
    assert np.array_equal(dest[1], rows[first_rows[:2] + 1])  # the layer it was in finished
    assert not dest[2].any() and not dest[3].any()  # and it stopped there
