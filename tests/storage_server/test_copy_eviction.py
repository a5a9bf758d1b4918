"""Which decoded copies make room (:func:`storage_server.copy_eviction.victims`): speculative copies (made after a
kv-put) never cost a copy a kv-get read, nor more than their share of another tenant's speculative copies; a
tenant's kv-gets take another tenant's read copies only down to their own share."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from storage_server.copy_eviction import Held, victims


def h(ident, size=10, tenant="a", speculative=False, readers=0) -> Held:
    return Held(ident, size, tenant, speculative, readers)


def test_room_already_free_evicts_nothing_and_a_copy_larger_than_the_budget_never_fits():
    assert victims([h(1)], used=10, budget=100, room=50, tenant="a", speculative=False) == []
    assert victims([], used=0, budget=100, room=101, tenant="a", speculative=False) is None


def test_a_read_copys_fill_evicts_speculative_copies_first_then_the_least_recently_used():
    held = [h("old-read"), h("spec", speculative=True), h("new-read")]
    assert victims(held, used=30, budget=30, room=10, tenant="a", speculative=False) == ["spec"]
    assert victims(held, used=30, budget=30, room=20, tenant="a", speculative=False) == ["spec", "old-read"]


def test_a_copy_a_transfer_reads_is_never_evicted():
    held = [h("busy", readers=1), h("free")]
    assert victims(held, used=20, budget=20, room=10, tenant="a", speculative=False) == ["free"]
    assert victims(held, used=20, budget=20, room=20, tenant="a", speculative=False) is None


def test_a_speculative_fill_never_evicts_a_read_copy():
    held = [h("read-1"), h("read-2")]
    assert victims(held, used=20, budget=20, room=10, tenant="a", speculative=True) is None


def test_a_speculative_fill_evicts_its_own_tenants_guesses_first():
    held = [h("b1", tenant="b", speculative=True), h("a1", speculative=True), h("a2", speculative=True)]
    assert victims(held, used=30, budget=30, room=10, tenant="a", speculative=True) == ["a1"]


def test_another_tenants_guesses_go_only_while_it_holds_more_than_the_filler():
    held = [h(f"b{i}", tenant="b", speculative=True) for i in range(4)] + [h("c0", tenant="c", speculative=True)]
    # b holds 40, c 10, the filler a 0: b gives room until it would hold less than a
    assert victims(held, used=50, budget=50, room=10, tenant="a", speculative=True) == ["b0"]
    assert victims(held, used=50, budget=50, room=20, tenant="a", speculative=True) == ["b0", "b1"]
    # a's own a0 goes first; a would then hold 30: b (40) gives b0 and keeps 30, but a further one would leave it below a
    assert victims(held + [h("a0", tenant="a", speculative=True)], used=60, budget=60, room=20, tenant="a", speculative=True) == ["a0", "b0"]
    assert victims(held + [h("a0", tenant="a", speculative=True)], used=60, budget=60, room=30, tenant="a", speculative=True) is None
    assert victims(held, used=50, budget=50, room=30, tenant="a", speculative=True) is None


def test_another_tenants_read_copies_go_only_while_it_holds_at_least_what_the_filler_will():
    held = [h(f"b{i}", tenant="b") for i in range(4)] + [h("a0"), h("c0", tenant="c")]
    # a will hold 10 + 20 = 30: b (40) gives its oldest and keeps 30; the next would leave it below a; c (10) none;
    # then a's own copy
    assert victims(held, used=60, budget=60, room=20, tenant="a", speculative=False) == ["b0", "a0"]
    # room for 40: a would hold 50, more than b's 40, so b gives nothing, and a's own copy is not enough: no room
    assert victims(held, used=60, budget=60, room=40, tenant="a", speculative=False) is None
    # the tenant holding most fills: it evicts its own, least recently used first, never the others'
    assert victims(held, used=60, budget=60, room=20, tenant="b", speculative=False) == ["b0", "b1"]
    # a copy passed over becomes fair once the filler's own are gone: B1 (b keeps 4 >= a's 4 once A1 is gone)
    held2 = [h("B1", size=1, tenant="b"), h("A1", size=3), h("B2", size=4, tenant="b")]
    assert victims(held2, used=8, budget=8, room=4, tenant="a", speculative=False) == ["A1", "B1"]
    # guesses of any tenant still go first
    assert victims([h("s", tenant="c", speculative=True)] + held, used=70, budget=70, room=10, tenant="b",
                   speculative=False) == ["s"]


@given(st.lists(st.tuples(st.integers(1, 50), st.sampled_from("abc"), st.booleans(), st.integers(0, 1)), max_size=12),
       st.integers(1, 80), st.sampled_from("abc"), st.booleans())
def test_the_rules_hold_for_any_set_of_copies(rows, room, tenant, speculative):
    held = [Held(i, size, t, spec, readers) for i, (size, t, spec, readers) in enumerate(rows)]
    used = sum(x.size for x in held)
    budget = max(used, 100)
    out = victims(held, used, budget, room, tenant, speculative)
    if out is None:
        return
    gone = {x.ident: x for x in held if x.ident in out}
    assert len(gone) == len(out)  # each at most once
    assert used - sum(x.size for x in gone.values()) + room <= budget  # the room fits
    assert all(x.readers == 0 for x in gone.values())  # none a transfer reads
    if not speculative and {x.tenant for x in held} <= {tenant}:  # one tenant: speculative first, then plain LRU
        order = [x.ident for x in held if x.readers == 0 and x.speculative] + [x.ident for x in held if x.readers == 0 and not x.speculative]
        assert out == order[: len(out)]
    if not speculative:  # another tenant's read copies go only while it keeps at least the filler's read bytes
        mine = sum(x.size for x in held if not x.speculative and x.tenant == tenant and x.ident not in gone) + room
        for other in {x.tenant for x in gone.values() if not x.speculative} - {tenant}:
            assert sum(x.size for x in held if not x.speculative and x.tenant == other and x.ident not in gone) >= mine
    if speculative:
        assert all(x.speculative for x in gone.values())  # a guess never costs a read copy
        mine = sum(x.size for x in held if x.speculative and x.tenant == tenant and x.ident not in gone) + room
        for other in {x.tenant for x in gone.values()} - {tenant}:  # another tenant keeps at least the filler's share
            assert sum(x.size for x in held if x.speculative and x.tenant == other and x.ident not in gone) >= mine
