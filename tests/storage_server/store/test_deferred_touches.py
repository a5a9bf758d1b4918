"""A kv-get's touch of its prefix waits for the policy's next decision: the decision is the same as if it had not."""

from __future__ import annotations

from storage_server.store.cache.deferred_touches import DeferredTouches
from storage_server.store.cache.policy import make_policy


def _filled(name: str, chains: dict[str, list[str]]):
    plain, deferred = make_policy(name), DeferredTouches(make_policy(name))
    for policy in (plain, deferred):
        for keys in chains.values():
            policy.add_chain([(k, 100) for k in keys])
    return plain, deferred


def test_victims_are_chosen_as_if_every_touch_had_been_applied_at_once():
    chains = {c: [f"{c}{i}" for i in range(4)] for c in "abcd"}
    for name in ("lru", "prefix", "reuse"):
        plain, deferred = _filled(name, chains)
        for c in "cab":
            plain.touch_chain(chains[c])
            deferred.touch_chain(chains[c])
        assert deferred.victims(400) == plain.victims(400), name  # d's chain, untouched, goes first
        assert deferred.used == plain.used


def test_a_chain_served_again_while_queued_moves_to_the_back():
    chains = {c: [f"{c}{i}" for i in range(3)] for c in "ab"}
    plain, deferred = _filled("lru", chains)
    a, b = chains["a"], chains["b"]
    for keys in (a, b, a):
        deferred.touch_chain(keys)  # the same list twice: queued once, at its latest place
    plain.touch_chain(b)
    plain.touch_chain(a)
    assert len(deferred._pending) == 2
    assert deferred.victims(300) == plain.victims(300) and set(plain.victims(300)) == set(b)


def test_pins_go_straight_through_and_keep_the_queue():
    chains = {"a": ["a0", "a1"]}
    _, deferred = _filled("reuse", chains)
    deferred.touch_chain(chains["a"])
    deferred.pin(["a0"])
    assert deferred.pinned("a0") and len(deferred._pending) == 1  # a kv-get's pin does not pay for the touches
    deferred.unpin(["a0"])
    deferred.remove("a1")
    assert not deferred._pending and "a1" not in deferred and len(deferred) == 1
