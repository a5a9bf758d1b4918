"""The executor runs the read path the planner chose: layers 0..n₁−1 through the page cache and the rest with O_DIRECT,
byte-exact and in layer order; two concurrent cold transfers split one page-cache budget (the second plans with what
the first left). Real chunk files, evicted from the page cache; the destination is page-aligned memory as over shm."""

from __future__ import annotations

import asyncio
import mmap
import os
from pathlib import Path

import numpy as np
import pytest
from pagecache import evict_fds

from protocol.wire import Descriptor, Mode, Target, TransportKind
from storage_server.direct_reads import DIRECT
from storage_server.executor import Executor, ReadPlan
from storage_server.memory_budget import MemoryBudget
from storage_server.read_path import MemoryFacts
from storage_server.store import PinnedChunks
from storage_server.transports.base import Transport

L, N, S = 8, 6, 8192  # layers, chunks, bytes of one layer of one chunk (O_DIRECT-aligned)
LAYER = N * S

pytestmark = pytest.mark.skipif(not DIRECT, reason="no O_DIRECT on this platform")


class Frames:
    def __init__(self) -> None:
        self.ready: list[int] = []

    async def layer_ready(self, layer: int, offset: int, length: int, checksum: int) -> None:
        self.ready.append(layer)


class Memory(Transport):
    """The client's memory, page-aligned (as a registered shm region is)."""

    name = "test"
    reads_into_destination = True

    def __init__(self, frames: Frames) -> None:
        super().__init__(frames, 0, S, N, L)  # type: ignore[arg-type]
        self.map = mmap.mmap(-1, L * N * S)
        self.view = memoryview(self.map)

    @classmethod
    def open(cls, request):  # pragma: no cover - not opened through the registry here
        raise NotImplementedError

    def piece_buffer(self, layer: int, first: int, last: int) -> memoryview:
        start = self.piece_offset(layer, first)
        return self.view[start : start + (last - first) * S]

    def payload_buffer(self) -> memoryview:
        return self.view[: L * N * S]


def chunk_files(tmp_path: Path, name: str, seed: int) -> tuple[list[int], np.ndarray]:
    """N chunk files (layer-major inside, L·S bytes each), evicted from the page cache; their fds and the payload expected."""
    chunks = np.random.default_rng(seed).integers(0, 256, (N, L, S), dtype=np.uint8)
    fds = []
    for j in range(N):
        p = tmp_path / f"{name}-{j}"
        p.write_bytes(chunks[j].tobytes())
        fds.append(os.open(p, os.O_RDONLY))
    evict_fds(fds)
    return fds, chunks.transpose(1, 0, 2).reshape(L, N * S)  # [layer][chunk j at j·S]


async def fetch(executor: Executor, fds: list[int]) -> tuple[np.ndarray, list[int], object]:
    d = Descriptor([f"k{j}" for j in range(N)], L, 16, S, Target(TransportKind.SHM), mode=Mode.LAYERWISE)
    frames = Frames()
    memory = Memory(frames)
    pinned = PinnedChunks.whole_files(fds, [L * S] * N)
    stats = await executor.run(ReadPlan.of(d, Mode.LAYERWISE, pinned, N), memory)
    return np.frombuffer(memory.map, np.uint8).reshape(L, N * S).copy(), frames.ready, stats


def test_the_first_layers_come_through_the_page_cache_and_the_rest_o_direct_byte_exact(tmp_path: Path):
    fds, expected = chunk_files(tmp_path, "c", seed=1)
    executor = Executor(2, direct_depth=4, read_path="planner", budget=MemoryBudget(lambda: MemoryFacts(3 * LAYER + 100), refresh_s=0))
    try:
        got, ready, stats = asyncio.run(fetch(executor, fds))
    finally:
        executor.close()
        for fd in fds:
            os.close(fd)
    if stats.direct_read_bytes == 0 and stats.resident_sample > 0.5:
        pytest.skip("the page cache kept the test files (fadvise DONTNEED ignored here)")
    assert np.array_equal(got, expected) and ready == list(range(L))
    assert stats.read_ahead_bytes == 3 * LAYER and stats.direct_read_bytes == (L - 3) * LAYER
    assert executor.budget.held == 0


@pytest.mark.parametrize(("policy", "direct_layers"), [("page-cache", 0), ("direct", L)])
def test_the_fixed_policies_read_every_layer_one_way(tmp_path: Path, policy: str, direct_layers: int):
    fds, expected = chunk_files(tmp_path, policy, seed=2)
    executor = Executor(2, direct_depth=4, read_path=policy, budget=MemoryBudget(lambda: MemoryFacts(3 * LAYER), refresh_s=0))
    try:
        got, ready, stats = asyncio.run(fetch(executor, fds))
    finally:
        executor.close()
        for fd in fds:
            os.close(fd)
    assert np.array_equal(got, expected) and ready == list(range(L))
    assert stats.direct_read_bytes == direct_layers * LAYER


def test_two_concurrent_cold_transfers_split_one_budget(tmp_path: Path):
    a, expected_a = chunk_files(tmp_path, "a", seed=3)
    b, expected_b = chunk_files(tmp_path, "b", seed=4)
    budget = MemoryBudget(lambda: MemoryFacts(L * LAYER + 2 * LAYER), refresh_s=0)  # one whole payload and two layers
    executor = Executor(2, direct_depth=4, read_path="planner", budget=budget)

    async def both():
        return await asyncio.gather(fetch(executor, a), fetch(executor, b))

    try:
        (got_a, _, first), (got_b, _, second) = asyncio.run(both())
    finally:
        executor.close()
        for fd in a + b:
            os.close(fd)
    assert np.array_equal(got_a, expected_a) and np.array_equal(got_b, expected_b)
    # The first took what it needed (every layer through the page cache); the second planned with the two layers left.
    assert (first.direct_read_bytes, first.read_ahead_bytes) == (0, L * LAYER)
    assert (second.direct_read_bytes, second.read_ahead_bytes) == ((L - 2) * LAYER, 2 * LAYER)
    assert budget.held == 0
