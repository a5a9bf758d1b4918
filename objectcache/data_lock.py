"""One server per data directory: an exclusive ``flock`` on ``<data_dir>/objectcache.lock``.

A second server on the same directory would take over its RPC socket and rewrite its
``dev-credentials.env``; the lock refuses it before it writes anything. The kernel releases a
``flock`` when the last descriptor of its open file closes, so a crashed server never leaves a
stale lock. ``serve`` hands its descriptor to the storage server it spawns (``--lock-fd``): the
lock then lives as long as either holds it, and a restarted storage server takes it over.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

LOCK_FILE = "objectcache.lock"


class DataDirInUse(Exception):
    """Another live process holds the data directory's lock."""


def _holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "another process"


def lock_data_dir(data_dir: Path) -> int:
    """Take the data directory's lock for this process's life; returns the locked descriptor.

    The directory is created only when missing (nothing else is written before the lock is held);
    the pid written into the lock file is what a refused second server names.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise DataDirInUse(f"data directory {data_dir} is in use by another ObjectCache server ({_holder(path)} holds "
                               f"{path}); stop it or choose another --data-dir") from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def adopt_lock(fd: int, data_dir: Path) -> int:
    """Check that ``fd`` (inherited from ``serve``) is this data directory's locked lock file."""
    try:
        same = os.fstat(fd).st_ino == (data_dir / LOCK_FILE).stat().st_ino
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the same open file: succeeds at once when it is ours
    except OSError:
        same = False
    if not same:
        raise DataDirInUse(f"--lock-fd {fd} is not the lock of data directory {data_dir}")
    os.set_inheritable(fd, False)
    return fd
