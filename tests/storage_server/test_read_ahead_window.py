"""The page-cache layers' read-ahead moves with the layer being read: layer 0 is asked for alone (nothing queued beside
it), then a window of layers from the one being read, never past n₁ or the budget. Real chunk files, evicted from the
page cache; what is asked for is seen in the page cache itself (``cachestat``/``mincore``), not in a record of calls."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest
from pagecache import evict_fds

from protocol.wire import Descriptor, Mode, Target, TransportKind
from storage_server.read_ahead import WindowedReadAhead
from storage_server.read_plan import ReadPlan
from storage_server.residency import page_cached
from storage_server.store import PinnedChunks

L, N, S = 8, 4, 16384  # layers, chunks, bytes of one layer of one chunk (four pages)


@pytest.fixture
def plan(tmp_path: Path):
    fds = []
    for j in range(N):
        p = tmp_path / f"chunk{j}"
        p.write_bytes(np.random.default_rng(j).integers(0, 256, L * S, dtype=np.uint8).tobytes())
        fds.append(os.open(p, os.O_RDONLY))
    evict_fds(fds)
    d = Descriptor([f"k{j}" for j in range(N)], L, 16, S, Target(TransportKind.SHM), mode=Mode.LAYERWISE)
    yield ReadPlan.of(d, Mode.LAYERWISE, PinnedChunks.whole_files(fds, [L * S] * N), N)
    for fd in fds:
        os.close(fd)


def cached_layers(plan: ReadPlan) -> list[int]:
    """Layers whose every page, in every chunk, is in the page cache."""
    return [layer for layer in range(L)
            if all(page_cached(fd, layer * S + page) for fd in plan.fds for page in range(0, S, 4096))]


def test_layer_0_alone_then_the_window_then_nothing_past_n1(plan: ReadPlan):
    ahead = WindowedReadAhead(plan, page_cache_layers=6, window=2, budget=6 * N * S)

    async def steps() -> list[tuple[int, list[int]]]:
        seen = []
        for layer in range(L):  # the executor calls before_layer for every layer it reads, page-cache or not
            await ahead.before_layer(N * S)
            await ahead.settle()  # the background advice done, so what it asked for is in the cache
            seen.append((ahead.asked, cached_layers(plan)))
        return seen

    seen = asyncio.run(steps())
    if seen[0][1] != [0] and seen[0][1] == list(range(L)):
        pytest.skip("this filesystem keeps every page cached (tmpfs)")
    layer = N * S
    assert seen[0] == (layer, [0])  # layer 0 alone: nothing else asked beside it
    assert seen[1] == (3 * layer, [0, 1, 2])  # layer 1 and the one ahead of it
    assert seen[2] == (4 * layer, [0, 1, 2, 3])
    assert seen[-1] == (6 * layer, [0, 1, 2, 3, 4, 5])  # never past n₁: layers 6 and 7 are not read ahead


def test_the_budget_bounds_what_is_asked_for(plan: ReadPlan):
    ahead = WindowedReadAhead(plan, page_cache_layers=6, window=2, budget=2 * N * S + 1)

    async def steps() -> int:
        for _ in range(L):
            await ahead.before_layer(N * S)
        return await ahead.settle()

    assert asyncio.run(steps()) == 2 * N * S  # whole chunk ranges up to the budget, no more


def test_window_0_asks_for_every_page_cache_layer_at_once(plan: ReadPlan):
    ahead = WindowedReadAhead(plan, page_cache_layers=5, window=0, budget=L * N * S)

    async def start() -> tuple[int, list[int]]:
        ahead.start()  # chunkwise, or read_ahead_window_bytes = 0: no before_layer needed
        asked = await ahead.settle()
        return asked, cached_layers(plan)

    asked, layers = asyncio.run(start())
    if layers == list(range(L)):
        pytest.skip("this filesystem keeps every page cached (tmpfs)")
    assert (asked, layers) == (5 * N * S, [0, 1, 2, 3, 4])
