"""``bench peers --cases / --paths``: the narrow reruns of chosen rows and paths parse as the help says; its targets judge
every size run and the issue's table of sizes apart, and the 3,584-chunk prefix's first layer where it was run."""

import argparse

import pytest

from bench.peers import FIRST_LAYER_CASE, FIRST_LAYER_GOAL_MS, ISSUE_TABLE, OBJECTCACHE_PATHS, _cases, _paths, targets


def test_cases_parse_g_by_n_pairs():
    assert _cases("64x64,256x64") == [(64, 64), (256, 64)]
    assert _cases("16×3584") == [(16, 3584)]
    with pytest.raises(argparse.ArgumentTypeError):
        _cases("64-64")


def test_paths_are_a_subset_of_objectcache_paths():
    assert _paths("shm-local") == ["shm-local"]
    assert _paths(",".join(OBJECTCACHE_PATHS)) == list(OBJECTCACHE_PATHS)
    with pytest.raises(argparse.ArgumentTypeError, match="unknown path"):
        _paths("shm,nvme")


def _row(g: int, n: int, **gbps: float) -> dict:
    return {"chunk_tokens": g, "chunks": n, "paths": {p: {"gb_per_s": v, "first_layer_ms": 1.0} for p, v in gbps.items()}}


def test_targets_judge_every_size_run_and_the_issues_table_apart():
    ahead = {"ObjectCache-shm-local": 2.0, "Mooncake-shm": 1.0}
    rows = [_row(g, n, **ahead) for g, n in ISSUE_TABLE] + [_row(64, 64, **{"ObjectCache-shm-local": 0.9, "Mooncake-shm": 1.0})]
    met = targets(rows)
    assert met["ObjectCache-shm-local ≥ Mooncake-shm at every size"] is False  # the G=64 row beside the table
    table = [k for k in met if "issue's table" in k]
    assert len(table) == 1 and met[table[0]] is True
    assert not any("issue's table" in k for k in targets(rows[1:]))  # a run without the whole table does not judge it
    assert not any("issue's table" in k for k in targets([rows[0], *rows[:3]]))  # nor one that repeats a size instead
    rows[0]["paths"]["Mooncake-shm"]["gb_per_s"] = 3.0
    assert targets(rows)[table[0]] is False


def test_first_layer_target_where_the_3584_chunk_prefix_was_run():
    row = _row(*FIRST_LAYER_CASE, **{"ObjectCache-shm-local": 1.0})
    row["paths"]["ObjectCache-shm-local"]["first_layer_ms"] = FIRST_LAYER_GOAL_MS + 0.01
    assert targets([row]) == {"ObjectCache-shm-local's first layer of G16×3584 ≤ 3 ms": False}
    row["paths"]["ObjectCache-shm-local"]["first_layer_ms"] = FIRST_LAYER_GOAL_MS
    assert targets([row]) == {"ObjectCache-shm-local's first layer of G16×3584 ≤ 3 ms": True}
    slower = _row(*FIRST_LAYER_CASE, **{"ObjectCache-shm-local": 1.0})
    slower["paths"]["ObjectCache-shm-local"]["first_layer_ms"] = 3.5
    assert targets([slower, row]) == {"ObjectCache-shm-local's first layer of G16×3584 ≤ 3 ms": False}  # every run of it
