"""Soft pins (pure): under every cache.policy a soft-pinned chunk is never a victim until its TTL ends, then it is;
a tenant's soft-pinned bytes never exceed the bound; a TTL beyond the limit or soft pins switched off are refused."""

from __future__ import annotations

import pytest

from storage_server.store.cache.policy import POLICIES, make_policy
from storage_server.store.cache.soft_pins import SoftPinLimits, SoftPinRefused, SoftPins


def _trim(policy, bound: int) -> None:
    if policy.used > bound:
        for v in policy.victims(policy.used - bound, partial=True) or []:
            policy.remove(v)


@pytest.mark.parametrize("name", POLICIES)
def test_a_soft_pinned_prefix_survives_pressure_until_its_ttl(name: str):
    policy, soft = make_policy(name), SoftPins(SoftPinLimits(tenant_max_bytes=4, max_ttl_s=100))
    hot = [("sys0", 1), ("sys1", 1), ("sys2", 1)]
    policy.add_chain(hot, None, "ops")
    policy.pin(soft.mark("ops", hot, 10, now=0.0))
    for t in range(50):  # a flood of one-off chains, each evicting down to a bound of 5 chunks
        policy.add_chain([(f"x{t}a", 1), (f"x{t}b", 1)], None, "flood")
        policy.unpin(soft.expired(now=t * 0.1))
        _trim(policy, 5)
    assert all(k in policy for k, _ in hot)
    assert soft.expired(now=9.9) == []
    policy.unpin(soft.expired(now=10.0))
    assert soft.tenant_bytes("ops") == 0
    for t in range(50, 60):
        policy.add_chain([(f"x{t}a", 1), (f"x{t}b", 1)], None, "flood")
        _trim(policy, 5)
    assert not any(k in policy for k, _ in hot)


def test_the_bound_is_per_tenant_and_a_mark_again_moves_the_deadline_without_counting_twice():
    soft = SoftPins(SoftPinLimits(tenant_max_bytes=10, max_ttl_s=60))
    assert soft.mark("a", [("k1", 6)], 5, now=0) == ["k1"]
    with pytest.raises(SoftPinRefused, match="cache.soft_pin_tenant_max_bytes = 10"):
        soft.mark("a", [("k2", 5)], 5, now=0)  # 11 bytes: refused, nothing marked
    assert soft.tenant_bytes("a") == 6 and "k2" not in soft
    assert soft.mark("b", [("k3", 10)], 5, now=0) == ["k3"]  # another tenant's own bound
    assert soft.mark("a", [("k1", 6), ("k4", 4)], 30, now=1) == ["k4"]  # k1 again: no new bytes, new deadline
    assert soft.tenant_bytes("a") == 10
    assert sorted(soft.expired(now=6)) == ["k3"]  # k1's first deadline is stale
    assert sorted(soft.expired(now=31)) == ["k1", "k4"]
    assert soft.tenant_bytes("a") == 0 and soft.status() == {}


def test_a_ttl_beyond_the_limit_and_soft_pins_switched_off_are_refused():
    with pytest.raises(SoftPinRefused, match="cache.soft_pin_max_ttl_s"):
        SoftPins(SoftPinLimits(tenant_max_bytes=10, max_ttl_s=60)).mark("a", [("k", 1)], 61, now=0)
    with pytest.raises(SoftPinRefused, match="soft pins are off"):
        SoftPins(SoftPinLimits()).mark("a", [("k", 1)], 1, now=0)
