"""Crash clean-up: files no acknowledged write references.

A crash before a commit leaves at most an unreferenced file, in ``tmp/`` (swept at
start-up) or in ``objects/`` (reclaimed by the storage server's housekeeping). Both
sweeps spare files written within ``GRACE_S``: the other process (gateway or storage
server) opens the same store and may be writing them right now.
"""

from __future__ import annotations

import stat
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

# Files younger than this are never swept: a write in progress touches its file
# continuously and commits within moments of its last byte.
GRACE_S = 3600.0


def older_than(paths: Iterable[Path], grace_s: float) -> Iterator[Path]:
    """The regular files among ``paths`` last modified more than ``grace_s`` seconds ago."""
    cutoff = time.time() - grace_s
    for p in paths:
        try:
            st = p.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_mtime < cutoff:
            yield p


def sweep_tmp(tmp_dir: Path, grace_s: float = GRACE_S) -> int:
    """Remove writes that were never acknowledged, sparing recent ones; how many."""
    removed = 0
    for p in older_than(tmp_dir.iterdir(), grace_s):
        p.unlink(missing_ok=True)
        removed += 1
    return removed


def reclaim_orphans(objects_dir: Path, referenced_names: Callable[[], set[str]], grace_s: float = GRACE_S) -> int:
    """Delete object files no metadata row references (a crash between publish and commit, or between
    a commit and the unlink of the file it replaced); how many.

    Files are listed before the metadata is read, so a file committed meanwhile counts as
    referenced; files are matched by name (never-reused uuids), so a moved data directory
    cannot make live files look unreferenced.
    """
    candidates = list(older_than((f for d in objects_dir.iterdir() if d.is_dir() for f in d.iterdir()), grace_s))
    if not candidates:
        return 0
    referenced = referenced_names()
    removed = 0
    for f in candidates:
        if f.name not in referenced:
            f.unlink(missing_ok=True)
            removed += 1
    return removed
