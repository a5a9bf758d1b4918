"""Threads that use only the cores nothing else wants: nice 19 for the calling thread alone (Linux; elsewhere a no-op)."""

from __future__ import annotations

import os
import threading


def lowest_priority() -> None:
    """This thread at nice 19 (a ThreadPoolExecutor's initializer): any runnable nice-0 thread, of this process or
    another, preempts it, so it adds work only on a core that would otherwise idle."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (OSError, AttributeError):
        pass


def idle_priority() -> None:
    """This thread under SCHED_IDLE (Linux): it runs only on a core with nothing else to run, and the scheduler counts
    a core running it as idle, so a woken thread (the engine reading its layer frames) is placed there at once; a
    nice-19 thread still made a woken one queue behind the busy core it was sent to. Else nice 19."""
    try:
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError):
        lowest_priority()


def normal_priority(tid: int) -> None:
    """Thread ``tid`` back under SCHED_OTHER at nice 0 (Linux; elsewhere a no-op)."""
    try:
        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, tid, 0)
    except (OSError, AttributeError):
        pass


def priority_reversible() -> bool:
    """Whether this process may raise a thread it lowered back to nice 0 (root, or RLIMIT_NICE allowing nice 0)."""
    try:
        import resource

        return os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20
    except (OSError, AttributeError, ImportError):
        return False
