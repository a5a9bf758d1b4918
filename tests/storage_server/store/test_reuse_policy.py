"""The ``reuse`` policy learns which kind of chunk is used again: after chains whose last chunk (the partial block
a next turn replaces) always went unused and whose body was always reused, a fresh chain's last chunk goes before
an *older* body chunk; with nothing learnt it is the prefix tree's LRU; a run that continues a chain (stored below
a leaf) is a class apart from one branching off a shared prompt; and how far the odds move a chunk is the age at
which chunks are hit, not the cache's size."""

from __future__ import annotations

import math

import pytest

from storage_server.store.cache.reuse import HORIZON, ReusePolicy


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
    assert policy.odds(("new", "run", "", "end")) < 0.1 < 0.9 < policy.odds(("new", "head", "", "body"))
    policy.add("old", 1)  # a lone chunk stored alone: a body chunk of its class
    policy.add_chain([("x0", 1), ("x1", 1), ("x2", 1)])
    policy.touch_chain(["x0", "x1"])
    policy.add_chain([("y0", 1), ("y1", 1)])
    # the chain end x2, newer than "old", goes first (LRU would take "old" first)
    assert policy.victims(1) == ["x2"]


def _learn_conversations_continue_and_branches_do_not(policy: ReusePolicy, rounds: int) -> None:
    """A shared root; per round a branch off it (a conversation's first turn) that is never read again, and a
    conversation's next turn stored below its previous turn's leaf, which is read again."""
    policy.add_chain([("root", 1)])
    policy.add_chain([("c", 1)], "root")  # the root has several children from the start
    for i in range(rounds):
        policy.add_chain([(f"b{i}", 1), (f"b{i}x", 1)], "root")  # below a chunk with several children
        policy.add_chain([(f"t{i}", 1), (f"t{i}x", 1)], "b0" if i == 0 else f"t{i - 1}x")  # below a leaf
        policy.touch_chain(["root", "c"])
        policy.touch_chain(["root", "b0", *(k for j in range(i + 1) for k in (f"t{j}", f"t{j}x"))])
        policy.remove(f"b{i}x") if i else None
        policy.remove(f"b{i}") if i else None


def test_a_run_continuing_a_chain_is_told_from_a_branch_off_a_shared_prompt():
    policy = ReusePolicy()
    _learn_conversations_continue_and_branches_do_not(policy, 40)
    assert policy.odds(("new", "below-root", "many", "body")) < 0.2 < 0.8 < policy.odds(("new", "deeper", "leaf", "body"))


def test_the_odds_move_a_chunk_by_the_age_at_which_chunks_are_hit():
    policy = ReusePolicy()
    _learn_conversations_continue_and_branches_do_not(policy, 40)
    # hits come a few chunks after a store: the mean hit age is far below the cache's size
    assert policy.hit_age is not None and 0 < policy.hit_age < len(policy) / 4
    clock = policy.clock
    policy.add("n0", 1, "root")  # a branch: low odds, so it is aged, but by about one hit age, not the cache's size
    behind = clock + 1 - policy._nodes["n0"].prio
    e_folds = math.log(policy.overall() / policy.odds(("new", "below-root", "many", "body")))
    assert e_folds > 1
    assert behind == pytest.approx(HORIZON * policy.hit_age * e_folds)
    assert behind < HORIZON * len(policy) * e_folds / 4  # the cache's size as the horizon would age it 4× as far


def test_a_chunk_fetched_for_the_request_that_touches_it_is_not_counted_as_reused():
    """The capacity tier fetches a kv-get's misses, then touches the whole chain: the fetched ones (``fresh``) are that
    request's first use. Counted as hits, every fetched chunk taught its class "reused at once"."""
    policy = ReusePolicy()
    for i in range(40):  # chunks fetched for one kv-get, touched by it, never asked for again
        policy.add(f"f{i}", 1)
        policy.touch_chain([f"f{i}"], fresh={f"f{i}"})
        policy.remove(f"f{i}")
    assert policy.odds(("new", "head", "", "body")) < 0.1
    counted = ReusePolicy()  # the same, without saying which were fresh: the class looks always reused
    for i in range(40):
        counted.add(f"f{i}", 1)
        counted.touch_chain([f"f{i}"])
        counted.remove(f"f{i}")
    assert counted.odds(("new", "head", "", "body")) > 0.9
