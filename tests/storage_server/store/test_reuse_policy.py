"""The experimental ``reuse`` policy learns which kind of chunk is used again: after chains whose last chunk
(the partial block a next turn replaces) always went unused and whose body was always reused, a fresh chain's
last chunk goes before an *older* body chunk; with nothing learnt it is the prefix tree's LRU."""

from __future__ import annotations

from storage_server.store.cache.reuse import ReusePolicy


def test_with_nothing_learnt_the_oldest_tail_goes_first():
    policy = ReusePolicy()
    policy.add_chain([("a0", 1), ("a1", 1)])
    policy.add_chain([("b0", 1), ("b1", 1)])
    assert policy.victims(2) == ["a1", "a0"]


def test_a_chain_end_that_is_never_reused_goes_before_an_older_body_chunk():
    policy = ReusePolicy()
    for i in range(40):  # a body chunk is read again, its chain's last chunk never
        body, end = f"c{i}b", f"c{i}e"
        policy.add_chain([(body, 1), (end, 1)])
        policy.touch_chain([body])
        policy.remove(end)
        policy.remove(body)
    assert policy.odds(("new", "below-root", "end")) < 0.1 < 0.9 < policy.odds(("new", "head", "body"))
    policy.add_chain([("old", 1)], None)  # a lone chunk: its chain's end, so the next one is a body chunk
    policy.add_chain([("x0", 1), ("x1", 1), ("x2", 1)])
    policy.touch_chain(["x0", "x1"])
    policy.add_chain([("y0", 1), ("y1", 1)])
    # y1 (newest, but a chain end) goes first; LRU would take "old" first
    assert policy.victims(1) == ["y1"]
