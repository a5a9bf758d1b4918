"""Every cache.policy: a pinned chunk is never a victim, the bound is always reachable from the unpinned ones, and a
tenant's own victims are its own (hypothesis drives random add/touch/pin/unpin/remove/evict sequences)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage_server.store.cache.policy import POLICIES, make_policy
from storage_server.store.cache.prefix_tree import PrefixTreePolicy

KEYS = [f"k{i}" for i in range(12)]
TENANTS = ["", "a", "b"]

op = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(KEYS), st.integers(1, 5), st.sampled_from([None, *KEYS]), st.sampled_from(TENANTS)),
    st.tuples(st.just("chain"), st.lists(st.sampled_from(KEYS), max_size=5, unique=True), st.integers(1, 5),
              st.sampled_from([None, *KEYS]), st.sampled_from(TENANTS)),
    st.tuples(st.just("touch"), st.lists(st.sampled_from(KEYS), max_size=5)),
    st.tuples(st.just("pin"), st.lists(st.sampled_from(KEYS), max_size=4)),
    st.tuples(st.just("unpin"), st.lists(st.sampled_from(KEYS), max_size=4)),
    st.tuples(st.just("remove"), st.sampled_from(KEYS)),
    st.tuples(st.just("evict"), st.integers(1, 30), st.booleans(), st.sampled_from([None, *TENANTS])),
)


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op, max_size=60))
def test_pinned_chunks_are_never_evicted_and_victims_are_exact(name: str, ops: list[tuple]):
    policy = make_policy(name)
    sizes: dict[str, int] = {}
    owners: dict[str, str] = {}
    pins: dict[str, int] = {}
    for o in ops:
        if o[0] == "add":
            _, key, size, parent, tenant = o
            policy.add(key, size, parent, tenant)
            sizes[key], owners[key] = size, tenant
        elif o[0] == "chain":
            _, keys, size, parent, tenant = o
            policy.add_chain([(k, size) for k in keys], parent, tenant)
            for k in keys:
                sizes[k], owners[k] = size, tenant
        elif o[0] == "touch":
            policy.touch_chain(o[1])
        elif o[0] == "pin":
            policy.pin(o[1])
            for k in o[1]:
                pins[k] = pins.get(k, 0) + 1
        elif o[0] == "unpin":
            policy.unpin(o[1])
            for k in o[1]:
                if pins.get(k, 0) > 1:
                    pins[k] -= 1
                else:
                    pins.pop(k, None)
        elif o[0] == "remove":
            assert policy.remove(o[1]) == sizes.pop(o[1], 0)
            owners.pop(o[1], None)
        else:
            _, need, partial, tenant = o
            victims = policy.victims(need, partial, tenant)
            candidates = {k for k in sizes if k not in pins and (tenant is None or owners[k] == tenant)}
            available = sum(sizes[k] for k in candidates)
            if available < need and not partial:
                assert victims is None
                continue
            assert victims is not None and len(set(victims)) == len(victims)
            assert set(victims) <= candidates  # never a pinned chunk, never another tenant's
            freed = sum(sizes[k] for k in victims)
            assert freed >= need or set(victims) == candidates
            for k in victims:
                policy.remove(k)
                del sizes[k], owners[k]
        assert policy.used == sum(sizes.values()) and len(policy) == len(sizes)
        assert all(k in policy for k in pins if k in sizes)
        for t in TENANTS[1:]:
            assert policy.tenant_used(t) == sum(s for k, s in sizes.items() if owners[k] == t)


def test_the_prefix_policy_evicts_a_one_off_tail_before_a_reused_shared_root_and_a_tail_before_its_head():
    policy = PrefixTreePolicy()
    root = ["r0", "r1"]
    for i, k in enumerate(root):
        policy.add(k, 1, root[i - 1] if i else None)
    policy.touch_chain(root)
    policy.touch_chain(root)  # two requests shared the root
    for i, k in enumerate(["t0", "t1", "t2"]):  # a one-off tail under it, stored later (more recent)
        policy.add(k, 1, "r1" if i == 0 else f"t{i - 1}")
    assert policy.victims(3) == ["t2", "t1", "t0"]
    assert policy.victims(4) == ["t2", "t1", "t0", "r1"]
