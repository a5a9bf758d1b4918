"""Dropping test files from the page cache, and waiting until the kernel really has.

One ``POSIX_FADV_DONTNEED`` is not always enough: a page can still sit in another CPU's LRU
batch, or be under writeback, and is then skipped silently. Tests that need cold chunks ask
again (bounded) until the storage server's own probe sees every file's first page missing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from storage_server.residency import page_cached

ATTEMPTS = 50


def evict_fds(fds: Iterable[int]) -> None:
    """Drop each open file's pages; raise if one stays cached after ``ATTEMPTS`` tries."""
    fds = list(fds)
    for fd in fds:
        os.fsync(fd)  # dirty pages are not dropped; Linux syncs through a read-only fd too
    for _ in range(ATTEMPTS):
        for fd in fds:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        fds = [fd for fd in fds if page_cached(fd, 0)]
        if not fds:
            return
        time.sleep(0.02)
    raise AssertionError(f"{len(fds)} test files stayed in the page cache after {ATTEMPTS} DONTNEED rounds")


def evict_tree(root: Path) -> None:
    """Drop every file under ``root`` from the page cache (clean, unmapped files need no root)."""
    fds = [os.open(p, os.O_RDONLY) for p in root.rglob("*") if p.is_file()]
    try:
        evict_fds(fds)
    finally:
        for fd in fds:
            os.close(fd)

