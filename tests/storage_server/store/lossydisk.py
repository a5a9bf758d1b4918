"""A filesystem that forgets what was never synced: the crash image of a local-disk store.

SIGKILL tests cannot show durability (the page cache survives a killed process). This records,
in the test's process, every ``fsync`` of a file or directory and every ``syncfs`` the store
makes, and builds the image a power cut would leave, strictly by POSIX: a file's bytes survive
only if it was synced since it last changed, a directory entry only if its directory was synced
since the entry appeared (a new directory's own entry is its parent's). Everything under the
root when recording starts counts as synced.

SQLite's files (the index) are copied as they are: SQLite syncs them itself, in C, where this
cannot see; :func:`index_is_synchronous` checks the settings that make its commits durable.
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from unittest import mock

from storage_server.store.localdisk import blobs

SQLITE_SUFFIXES = (".sqlite3", ".sqlite3-wal", ".sqlite3-shm", ".sqlite3-journal")


class LossyDisk:
    """Use as a context manager around the store's writes, then :meth:`crash_image` into a new directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self.files: dict[int, tuple[int, int]] = {}  # inode -> (size, mtime_ns) when last synced
        self.dirs: dict[int, dict[str, int]] = {}  # directory inode -> {name: inode} when last synced
        self.syncs = 0
        self._patches: list = []

    # -- recording -------------------------------------------------------------
    def _record(self, fd: int) -> None:
        st = os.fstat(fd)
        with self._lock:
            self.syncs += 1
            if stat.S_ISDIR(st.st_mode):
                self.dirs[st.st_ino] = _entries(f"/proc/self/fd/{fd}")
            else:
                self.files[st.st_ino] = (st.st_size, st.st_mtime_ns)

    def _record_all(self) -> None:
        """Everything under the root is synced now (the baseline, or a ``syncfs`` of its filesystem)."""
        with self._lock:
            self.syncs += 1
            for d, _, names in os.walk(self.root):
                self.dirs[os.stat(d).st_ino] = _entries(d)
                for n in names:
                    st = os.lstat(os.path.join(d, n))
                    self.files[st.st_ino] = (st.st_size, st.st_mtime_ns)

    def __enter__(self) -> "LossyDisk":
        self._record_all()
        real_fsync, real_fdatasync, real_syncfs = os.fsync, os.fdatasync, blobs._syncfs

        def fsync(fd: int) -> None:
            real_fsync(fd)
            self._record(fd if isinstance(fd, int) else fd.fileno())

        def fdatasync(fd: int) -> None:
            real_fdatasync(fd)
            self._record(fd if isinstance(fd, int) else fd.fileno())

        patches = [mock.patch("os.fsync", fsync), mock.patch("os.fdatasync", fdatasync)]
        if real_syncfs is not None:
            def syncfs(fd: int) -> int:
                rc = real_syncfs(fd)
                if rc == 0:
                    self._record_all()
                return rc
            patches.append(mock.patch.object(blobs, "_syncfs", syncfs))
        for p in patches:
            p.start()
        self._patches = patches
        return self

    def __exit__(self, *exc) -> None:
        for p in reversed(self._patches):
            p.stop()
        self._patches = []

    # -- the image -------------------------------------------------------------
    def crash_image(self, dest: Path) -> list[str]:
        """Copy what survives a power cut now into ``dest``; returns what was lost (paths under the root)."""
        lost: list[str] = []
        with self._lock:
            self._copy_dir(self.root, Path(dest), lost)
        return lost

    def _copy_dir(self, src: Path, dst: Path, lost: list[str]) -> None:
        dst.mkdir(parents=True, exist_ok=True)
        durable = self.dirs.get(os.stat(src).st_ino, {})
        for name, ino in sorted(_entries(str(src)).items()):
            path = src / name
            rel = str(path.relative_to(self.root))
            sqlite = name.endswith(SQLITE_SUFFIXES)
            if durable.get(name) != ino and not sqlite:
                lost.append(rel + " (entry)")
                continue
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                self._copy_dir(path, dst / name, lost)
            elif sqlite or self.files.get(st.st_ino) == (st.st_size, st.st_mtime_ns):
                shutil.copyfile(path, dst / name)
            else:
                lost.append(rel + " (bytes)")
                (dst / name).write_bytes(b"")  # the name survived, the unsynced bytes did not


def _entries(d: str) -> dict[str, int]:
    out = {}
    for name in os.listdir(d):
        try:
            out[name] = os.lstat(os.path.join(d, name)).st_ino
        except FileNotFoundError:
            pass
    return out


def index_is_synchronous(connect: Callable[[], object]) -> tuple[str, int]:
    """(journal_mode, synchronous) of a connection the index opens: WAL with FULL (2) makes each commit durable."""
    db = connect()
    try:
        return db.execute("PRAGMA journal_mode").fetchone()[0], db.execute("PRAGMA synchronous").fetchone()[0]
    finally:
        db.close()
