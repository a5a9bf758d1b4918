"""Child processes whose lives are tied to their parent's: when the parent dies (a SIGKILL included, where no
``finally`` or ``atexit`` runs) each child gets SIGTERM from the kernel, so no gateway or storage server outlives
``objectcache serve``, and no ``objectcache serve``, moto or SeaweedFS outlives a benchmark, holding ports, the data
directory and temporary directories.

Linux's ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child ends, not the process: benchmarks start
servers from pool threads that come and go (``bench compression-capacity`` starts its two nodes from a
``ThreadPoolExecutor``), so every child is forked by one thread of its own that lives as long as the process.
Elsewhere (no ``prctl``) children are started as before, with nothing tying them.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

PR_SET_PDEATHSIG = 1

_prctl = None
if sys.platform.startswith("linux"):
    try:
        _prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child must not load anything after fork
    except (OSError, AttributeError):
        _prctl = None

# One thread forks every child and never ends before the process does (its pool is never shut down).
_forker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lifeline-forker")


def _die_with(parent: int) -> None:
    """In the child, before exec: SIGTERM when the forking thread (so the parent) ends; if the parent already ended
    before this ran, end now."""
    if _prctl is not None and _prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0 and os.getppid() != parent:
        os._exit(1)


def spawn(argv: list[str], **popen: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv, **popen)``, the child ended by the kernel when this process ends."""
    if _prctl is None:
        return subprocess.Popen(argv, **popen)
    parent = os.getpid()
    return _forker.submit(lambda: subprocess.Popen(argv, preexec_fn=lambda: _die_with(parent), **popen)).result()
