"""When a continuously batching engine produces a request's first token (pure): boundaries, a full batch, a far horizon."""

from __future__ import annotations

import pytest

from scheduler.oracle import EngineClock, first_token_at


def test_an_idle_engine_starts_at_once():
    assert first_token_at(EngineClock(0.01), 5.0, now_s=5.0) == pytest.approx(5.01)


def test_a_running_engine_takes_the_request_at_its_next_boundary():
    engine = EngineClock(0.01, phase_s=0.0)
    # Ready at 1.003: the iteration that started at 1.000 ends at 1.010, then one step to the first token.
    assert first_token_at(engine, 1.003, now_s=1.0) == pytest.approx(1.02)
    # Another engine whose boundary comes sooner after the bytes land (1.0045) is faster by the difference.
    other = EngineClock(0.01, phase_s=0.0045)
    assert first_token_at(other, 1.003, now_s=1.0) == pytest.approx(1.0045 + 0.01)


def test_a_full_engine_waits_for_a_free_slot_first():
    engine = EngineClock(0.01, phase_s=0.0, free_at_s=2.0)
    # The slot frees at 2.0, beyond the iteration running now: half a step on average, then one step.
    assert first_token_at(engine, 1.003, now_s=1.0) == pytest.approx(2.015)


def test_beyond_the_running_iteration_the_wait_is_half_a_step_on_average():
    engine = EngineClock(0.01, phase_s=0.0)
    assert first_token_at(engine, 1.5, now_s=1.0) == pytest.approx(1.5 + 0.015)
    assert first_token_at(EngineClock(0.01, phase_s=0.004), 1.5, now_s=1.0) == pytest.approx(1.515)  # the phase no longer matters
