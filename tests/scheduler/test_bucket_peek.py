"""``TokenBucket.wait_s`` (what the load-budget check asks) is exactly what ``reserve`` would return, and reserves nothing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduler.pacing import TokenBucket
from storage_server.deadline import layer_in_time


@given(st.floats(1.0, 1e9), st.floats(0, 1e7), st.lists(st.tuples(st.floats(0, 1e7), st.floats(0, 5)), min_size=1, max_size=20))
def test_wait_s_is_reserves_delay_without_reserving(rate, burst, sends):
    bucket, now = TokenBucket(rate, burst), 0.0
    for nbytes, gap in sends:
        now += gap
        peek = bucket.wait_s(now)
        assert bucket.wait_s(now) == peek  # a peek reserves nothing
        assert bucket.reserve(nbytes, now) == peek


def test_an_unlimited_bucket_never_waits_and_a_layer_is_in_time_up_to_the_deadline():
    assert TokenBucket(float("inf"), 0).wait_s(5.0) == 0.0
    assert layer_in_time(1.0, 0.5, 1.5) and not layer_in_time(1.0, 0.51, 1.5)
