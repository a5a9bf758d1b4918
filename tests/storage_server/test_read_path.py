"""Dual-Blade's read-path planner (pure), the memory facts it reads (cgroup v1 and v2, a container's view), and the
one page-cache budget every concurrent transfer shares."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage_server.memory_budget import MemoryBudget
from storage_server.read_path import MemoryFacts, ReadPath, page_cache_budget, plan_read_path, read_ahead_frontier, read_ahead_window, read_memory_facts, wanted_bytes

L, LAYER = 8, 1000  # layers, bytes of one layer of every chunk


def plan(policy: str = "planner", resident: float = 0.0, granted: int = 0, direct_possible: bool = True) -> ReadPath:
    return plan_read_path(policy, num_layers=L, layer_bytes=LAYER, resident=resident, cold_fraction=0.5, granted=granted,
                          direct_possible=direct_possible)


def test_the_planner_gives_the_first_layers_that_fit_the_grant_the_page_cache_and_the_rest_o_direct():
    assert plan(granted=3 * LAYER + 999) == ReadPath(3, True, 3 * LAYER)
    assert plan(granted=0) == ReadPath(0, True, 0)
    assert plan(granted=100 * LAYER) == ReadPath(L, False, L * LAYER)  # everything fits: no direct layer


def test_warm_transfers_and_those_that_cannot_read_direct_stay_on_the_page_cache_within_the_grant():
    assert plan(resident=1.0, granted=5 * LAYER) == ReadPath(L, False, 0)  # warm: nothing to read ahead
    assert plan(resident=0.75, granted=5 * LAYER) == ReadPath(L, False, 5 * LAYER)
    assert plan(direct_possible=False, granted=2 * LAYER) == ReadPath(L, False, 2 * LAYER)


def test_the_fixed_policies_for_comparison():
    assert plan("page-cache", granted=2 * LAYER) == ReadPath(L, False, 2 * LAYER)
    assert plan("direct", granted=2 * LAYER) == ReadPath(0, True, 0)
    with pytest.raises(ValueError, match="read_path"):
        plan("fastest")


def test_what_a_transfer_asks_of_the_budget():
    assert wanted_bytes("planner", L, LAYER, 0.0, 0.5, True) == L * LAYER
    assert wanted_bytes("planner", L, LAYER, 1.0, 0.5, True) == 0
    assert wanted_bytes("direct", L, LAYER, 0.0, 0.5, True) == 0
    assert wanted_bytes("direct", L, LAYER, 0.0, 0.5, False) == L * LAYER  # it will read through the page cache


def test_the_budget_is_dual_blades_eq_1_and_2():
    assert page_cache_budget(MemoryFacts(10_000)) == 10_000
    assert page_cache_budget(MemoryFacts(10_000, cgroup_limit=6_000, cgroup_unreclaimable=2_500)) == 3_500
    assert page_cache_budget(MemoryFacts(10_000, cgroup_limit=6_000, cgroup_unreclaimable=2_500), reserved=1_000) == 2_500
    assert page_cache_budget(MemoryFacts(10_000, cgroup_limit=1_000, cgroup_unreclaimable=2_500)) == 0
    assert page_cache_budget(MemoryFacts(None)) == 0


def _root(tmp_path: Path, cgroup: str, files: dict[str, str]) -> Path:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/meminfo").write_text("MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n")
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_memory_facts_from_cgroup_v2(tmp_path: Path):
    root = _root(tmp_path, "0::/bench/kv\n", {"sys/fs/cgroup/bench/kv/memory.max": "1073741824\n",
                                              "sys/fs/cgroup/bench/kv/memory.stat": "anon 1000\nfile 99999\nshmem 24\n"})
    assert read_memory_facts(root) == MemoryFacts(20000000 * 1024, 1 << 30, 1024)


def test_memory_facts_from_cgroup_v1_seen_from_inside_a_container(tmp_path: Path):
    # /proc names the host's path; the container's mount shows its own cgroup as the root, and a child made in it
    root = _root(tmp_path, "4:memory:/process_api/abc/ocbench\n0::/\n",
                 {"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
                  "sys/fs/cgroup/memory/ocbench/memory.limit_in_bytes": "536870912\n",
                  "sys/fs/cgroup/memory/ocbench/memory.stat": "rss 10\ntotal_rss 4096\ntotal_shmem 4\ncache 77\n"})
    assert read_memory_facts(root) == MemoryFacts(20000000 * 1024, 512 << 20, 4100)


def test_memory_facts_without_a_limit(tmp_path: Path):
    root = _root(tmp_path, "4:memory:/\n0::/\n", {"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"})
    assert read_memory_facts(root) == MemoryFacts(20000000 * 1024)


def test_two_concurrent_transfers_share_one_budget_and_give_it_back():
    budget = MemoryBudget(lambda: MemoryFacts(10_000), refresh_s=0)
    with budget.holding(8_000) as first:
        with budget.holding(8_000) as second:
            assert first == [8_000] and second == [2_000]  # the second gets what the first left, not its own half
            assert budget.free() == 0
        assert budget.free() == 2_000
    assert budget.held == 0 and budget.free() == 10_000


def test_a_warm_transfer_wants_nothing_and_reads_no_facts():
    reads = []
    budget = MemoryBudget(lambda: reads.append(1) or MemoryFacts(10_000), refresh_s=0)
    with budget.holding(0) as grant:
        assert grant == [0]
    assert reads == [] and budget.held == 0 and budget.grants == 0
    with budget.holding(4_000) as grant:  # a cold one still asks
        assert grant == [4_000] and reads


# -- the read-ahead window of the page-cache layers (pure) --------------------------

MIB = 1 << 20


def test_the_read_ahead_window_is_at_least_its_bytes_and_two_layers_within_the_page_cache_layers():
    assert read_ahead_window(4 * MIB, 16, 8 * MIB, layerwise=True) == 2  # the bench's 4 MiB layers
    assert read_ahead_window(3 * MIB, 16, 8 * MIB, layerwise=True) == 3  # rounded up: at least the window's bytes
    assert read_ahead_window(224 * MIB, 32, 8 * MIB, layerwise=True) == 2  # huge layers: the next one still overlaps
    assert read_ahead_window(1000, 5, 8 * MIB, layerwise=True) == 5  # tiny layers: all page-cache layers fit
    assert read_ahead_window(4 * MIB, 1, 8 * MIB, layerwise=True) == 1


def test_no_window_asks_every_page_cache_layer_at_once():
    assert read_ahead_window(4 * MIB, 16, 0, layerwise=True) == 0  # read_ahead_window_bytes = 0: as before the window
    assert read_ahead_window(4 * MIB, 16, 8 * MIB, layerwise=False) == 0  # chunkwise reads every layer together
    assert read_ahead_window(4 * MIB, 0, 8 * MIB, layerwise=True) == 0
    assert [read_ahead_frontier(layer, 6, 0) for layer in range(6)] == [6] * 6


def test_layer_0_is_asked_for_alone_then_the_window_moves_with_the_layer_being_read():
    assert [read_ahead_frontier(layer, 6, 2) for layer in range(6)] == [1, 3, 4, 5, 6, 6]
    assert [read_ahead_frontier(layer, 6, 3) for layer in range(6)] == [1, 4, 5, 6, 6, 6]
    assert read_ahead_frontier(0, 0, 2) == 0  # no page-cache layer: nothing asked


@pytest.mark.parametrize("n1", [1, 2, 7, 32])
@pytest.mark.parametrize("window", [1, 2, 5, 40])
def test_the_frontier_covers_the_layer_being_read_never_passes_n1_and_never_goes_back(n1: int, window: int):
    frontiers = [read_ahead_frontier(layer, n1, window) for layer in range(n1)]
    assert frontiers[0] == 1  # nothing queued beside the first layer
    assert all(f >= layer + 1 for layer, f in enumerate(frontiers))  # a layer's pages are asked for before it is read
    assert all(f <= n1 for f in frontiers) and frontiers == sorted(frontiers)
    assert all(f - layer <= max(window, 1) for layer, f in enumerate(frontiers))  # at most the window in flight
