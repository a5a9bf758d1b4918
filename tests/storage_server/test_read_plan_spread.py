"""When a warm layer's copy is split across the cores: only where the engine's compute does not leave one thread time."""

from __future__ import annotations

from storage_server.read_plan import one_run_keeps_ahead


def test_one_thread_is_enough_when_the_engine_computes_longer_than_it_takes():
    # Layer 0 took 2.5 ms on two threads: one takes at most 5 ms, under 9.5 ms of compute per layer.
    assert one_run_keeps_ahead(2.5e-3, 2, (9.5e-3,))
    assert one_run_keeps_ahead(2.5e-3, 2, (9.5e-3, 20e-3, 12e-3))  # per-layer windows: the shortest decides


def test_every_core_gathers_when_the_compute_is_short_or_unknown():
    assert not one_run_keeps_ahead(2.5e-3, 2, (4e-3,))  # 5 ms on one thread would fall behind 4 ms of compute
    assert not one_run_keeps_ahead(2.5e-3, 2, (9.5e-3, 3e-3))
    assert not one_run_keeps_ahead(1e-4, 2, ())  # no compute window: the engine's pace is unknown
