"""Chunk locations are remembered only while nobody — no connection, no process — has committed to the index."""

from __future__ import annotations

import sqlite3

from storage_server.store.localdisk.locations import LocationCache


def _writer_and_cache(tmp_path) -> tuple[sqlite3.Connection, LocationCache]:
    """A metadata database, a connection that commits to it (another process's, as far as the cache knows) and a cache."""
    db_path = tmp_path / "meta.sqlite3"
    writer = sqlite3.connect(db_path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("CREATE TABLE t (x)")
    return writer, LocationCache(db_path)


def test_any_commit_by_another_connection_forgets_every_location(tmp_path):
    writer, cache = _writer_and_cache(tmp_path)
    assert cache.get("b", ["k1", "k2"]) is None  # nothing remembered yet
    cache.put("b", ["k1", "k2"], [("f1", 10), None], cache.seen)  # an absent key is not remembered
    assert cache.get("b", ["k1"]) == [("f1", 10)]
    assert cache.get("b", ["k1", "k2"]) is None and cache.get("other", ["k1"]) is None
    writer.execute("INSERT INTO t VALUES (1)")  # e.g. the gateway deleting an object
    assert cache.get("b", ["k1"]) is None  # forgotten
    assert cache.status()["entries"] == 0


def test_a_lookup_that_overlapped_a_commit_is_not_remembered(tmp_path):
    writer, cache = _writer_and_cache(tmp_path)
    cache.get("b", ["k"])
    started = cache.seen
    writer.execute("INSERT INTO t VALUES (1)")  # commits while the lookup runs
    assert cache.get("b", ["k"]) is None  # another lookup sees the new version ...
    cache.put("b", ["k"], [("old", 1)], started)  # ... so the first one's answer is dropped
    assert cache.get("b", ["k"]) is None
    cache.close()


def test_a_buckets_incarnation_is_forgotten_at_any_commit_and_an_overlapped_lookup_is_not_kept(tmp_path):
    """What a session's kv-get checks its bucket against: never an answer from before a delete (by any process)."""
    writer, cache = _writer_and_cache(tmp_path)
    assert cache.incarnation("b") is None
    cache.put_incarnation("b", "inc-1", cache.seen)
    assert cache.incarnation("b") == "inc-1" and cache.incarnation("other") is None
    writer.execute("INSERT INTO t VALUES (1)")  # e.g. the gateway deleting the bucket and another tenant creating it
    assert cache.incarnation("b") is None
    started = cache.seen
    writer.execute("INSERT INTO t VALUES (2)")  # commits while the lookup runs
    assert cache.incarnation("b") is None
    cache.put_incarnation("b", "inc-1", started)  # the overlapped answer is dropped
    assert cache.incarnation("b") is None
    cache.put_incarnation("b", "inc-2", cache.seen)
    assert cache.incarnation("b") == "inc-2"
    cache.close()
