"""The storage server's collector: no automatic full collection mid-transfer; full ones at idle housekeeping rounds."""

from __future__ import annotations

import gc

from storage_server.gc_schedule import NEVER, GcSchedule


def test_full_collections_wait_for_an_idle_round_but_not_forever():
    busy = [True]
    schedule = GcSchedule(busy=lambda: busy[0], max_deferrals=2)
    before = gc.get_threshold()
    schedule.start()
    try:
        assert gc.get_threshold()[2] == NEVER and gc.get_threshold()[:2] == before[:2]
        assert gc.get_freeze_count() > 0  # what start-up built is never scanned again
        assert [schedule.housekeeping() for _ in range(3)] == [False, False, True]  # busy: deferred twice, then run anyway
        busy[0] = False
        assert schedule.housekeeping() and schedule.collections == 2
    finally:
        schedule.stop()
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0  # a daemon run inside another program leaves it as it was


def test_cyclic_garbage_is_collected_at_the_idle_round():
    schedule = GcSchedule(busy=lambda: False)
    schedule.start()
    try:
        class Node:
            pass

        a, b = Node(), Node()
        a.peer, b.peer = b, a  # unreachable once deleted, and reference counting alone never frees it
        del a, b
        assert sum(type(o) is Node for o in gc.get_objects()) == 2
        assert schedule.housekeeping()
        assert sum(type(o) is Node for o in gc.get_objects()) == 0
    finally:
        schedule.stop()
