"""``bench cluster``'s oracle case: the path regret compares paths, not samples (pure)."""

from __future__ import annotations

import pytest

from bench.cluster_oracle import path_of, path_regret


def row(s: float, **paths: int) -> dict:
    return {"s": s, "paths": {k.replace("_", ":"): v for k, v in paths.items()}}


def test_a_path_is_the_kinds_its_chunks_came_from():
    assert path_of(row(1, peer_b=5, upstream=3, local=0)) == ("peer", "upstream")


def test_replays_on_the_scheduler_s_path_are_samples_of_it_not_a_better_choice():
    # All three took the upstream: no other path was measured, no regret, whatever the noise between the replays.
    assert path_regret([row(0.22, upstream=1), row(0.16, upstream=1), row(0.20, upstream=1)]) == 0.0
    # The scheduler split with a peer; the upstream alone (mean of its two samples: 0.18) was better by 0.2/0.18.
    assert path_regret([row(0.20, peer_a=1, upstream=2), row(0.45, peer_a=3), row(0.18, upstream=3)]) == pytest.approx(0.20 / 0.18 - 1)
    # The scheduler's path shares a replay with another: its time is their mean, set against the best path's.
    assert path_regret([row(0.30, upstream=1), row(0.20, upstream=1), row(0.24, peer_a=1)]) == pytest.approx(0.25 / 0.24 - 1)
