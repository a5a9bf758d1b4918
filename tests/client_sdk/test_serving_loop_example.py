"""The serving-loop example's stand-in compute releases the GIL, as a GPU kernel launch does, so loading overlaps it."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

from client_sdk.examples.serving_loop import compute_layer

BUDGET_S = 1.0


def another_thread_ran_during(work) -> bool:
    """Whether this thread got to run (five short sleeps) while ``work()`` was still running in another,
    with GIL hand-offs forced only every 5 s: a ``work`` that holds the GIL keeps this thread waiting until it
    ends; one that releases it lets these sleeps end long before its 1 s does. Decided by events (is the
    worker still alive once we ran), not by counting ticks of a clock."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    try:
        started = threading.Event()

        def run() -> None:
            started.set()
            work()

        worker = threading.Thread(target=run)
        worker.start()
        assert started.wait(30)
        for _ in range(5):
            time.sleep(0.001)
        ran_meanwhile = worker.is_alive()
        worker.join(30)
        assert not worker.is_alive()
        return ran_meanwhile
    finally:
        sys.setswitchinterval(old)


def test_compute_layer_takes_its_budget_and_releases_the_gil_meanwhile():
    kv = np.zeros((4, 2, 16, 8, 128), np.uint8)
    took = []
    assert another_thread_ran_during(lambda: took.append(compute_layer(kv, 128, BUDGET_S))), "compute_layer holds the GIL"
    assert took and took[0] >= BUDGET_S  # padded to its budget (a sleep never ends early); no upper bound: that is load


def test_the_check_catches_a_busy_loop():
    def busy():
        start = time.perf_counter()
        while time.perf_counter() - start < BUDGET_S:
            pass

    assert not another_thread_ran_during(busy)
