"""The session socket's key list names: a reference resolves only within the session that named it, and the lists
held are bounded per session and overall, least recently used first."""

from __future__ import annotations

from storage_server.session_key_lists import SessionKeyLists

A, B = b"a" * 16, b"b" * 16
R1, R2, R3 = b"1" * 16, b"2" * 16, b"3" * 16


def test_a_reference_resolves_only_in_the_session_that_named_it():
    lists = SessionKeyLists()
    lists.name(A, R1, ["k1", "k2"])
    assert lists.named(A, R1) == ["k1", "k2"]
    assert lists.named(B, R1) is None  # the same reference sent on another session (of any tenant) names nothing
    assert lists.resolved == 1


def test_naming_a_reference_again_replaces_its_keys():
    lists = SessionKeyLists()
    lists.name(A, R1, ["old"])
    lists.name(A, R1, ["new", "er"])
    assert lists.named(A, R1) == ["new", "er"] and lists.status()["keys"] == 2


def test_a_session_holds_at_most_its_share_of_lists_and_drops_its_least_recently_used():
    lists = SessionKeyLists(lists_per_session=2)
    lists.name(A, R1, ["x"])
    lists.name(A, R2, ["y"])
    lists.name(B, R1, ["other session"])
    assert lists.named(A, R1) == ["x"]  # R2 is now A's least recently used
    lists.name(A, R3, ["z"])
    assert lists.named(A, R2) is None and lists.named(A, R1) == ["x"] and lists.named(A, R3) == ["z"]
    assert lists.named(B, R1) == ["other session"]  # another session's lists are not A's to evict


def test_the_keys_held_are_bounded_across_sessions():
    lists = SessionKeyLists(max_keys=5)
    lists.name(A, R1, ["a"] * 3)
    lists.name(B, R1, ["b"] * 3)  # 6 > 5: the oldest list goes
    assert lists.named(A, R1) is None and lists.named(B, R1) == ["b"] * 3
    lists.name(A, R2, ["c"] * 6)  # larger than the whole bound: not held
    assert lists.named(A, R2) is None and lists.status() == {"lists": 1, "keys": 3, "resolved": 1}


def test_the_lists_held_are_bounded_in_number_too():
    lists = SessionKeyLists(max_lists=2)
    lists.name(A, R1, ["a"])
    lists.name(B, R1, ["b"])
    assert lists.named(A, R1) == ["a"]  # B's list is now the least recently used
    lists.name(A, R2, ["c"])
    assert lists.named(B, R1) is None and lists.named(A, R1) == ["a"] and lists.named(A, R2) == ["c"]
