"""The serving-loop example's stand-in compute releases the GIL, as a GPU kernel launch does, so loading overlaps it."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

from client_sdk.examples.serving_loop import compute_layer


def wakeups_of_another_thread_during(work) -> int:
    """How often another Python thread gets to run while ``work()`` runs, with GIL hand-offs forced only every 5 s."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(5.0)  # a thread that never releases the GIL keeps it for 5 s: the others stall
    try:
        worker = threading.Thread(target=work)
        worker.start()
        wakeups = 0
        for _ in range(1000):  # bounded: at 10 ms a tick, 10 s at most
            if not worker.is_alive():
                break
            time.sleep(0.01)
            wakeups += 1
        worker.join(10)
        return wakeups
    finally:
        sys.setswitchinterval(old)


def test_compute_layer_takes_its_budget_and_releases_the_gil_meanwhile():
    kv = np.zeros((4, 2, 16, 8, 128), np.uint8)
    took = []
    wakeups = wakeups_of_another_thread_during(lambda: took.append(compute_layer(kv, 128, 0.3)))
    assert took and 0.3 <= took[0] < 2.0
    assert wakeups >= 10, f"another thread ran only {wakeups} times in 0.3 s of compute: it holds the GIL"


def test_the_check_catches_a_busy_loop():
    def busy():
        start = time.perf_counter()
        while time.perf_counter() - start < 0.3:
            pass

    assert wakeups_of_another_thread_during(busy) <= 3
