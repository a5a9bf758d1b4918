"""The restart policy of `objectcache serve`: a single crash costs a moment, a crash loop backs off."""

from __future__ import annotations

from objectcache.restart import RestartBackoff


def test_every_crash_after_a_healthy_run_restarts_after_the_first_short_delay():
    backoff = RestartBackoff(first_s=0.5, cap_s=30, healthy_s=10)
    assert [backoff.delay_after_crash(uptime_s=60) for _ in range(10)] == [0.5] * 10


def test_a_crash_loop_doubles_the_delay_up_to_the_cap_and_a_healthy_run_resets_it():
    backoff = RestartBackoff(first_s=0.5, cap_s=4, healthy_s=10)
    assert [backoff.delay_after_crash(uptime_s=1) for _ in range(6)] == [0.5, 1, 2, 4, 4, 4]
    assert backoff.delay_after_crash(uptime_s=10) == 0.5
    assert backoff.delay_after_crash(uptime_s=2) == 1
