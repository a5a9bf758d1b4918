"""Every way the disk runs out is the catalogue's 507 InsufficientStorage; nothing else is."""

from __future__ import annotations

import errno
import os
import sqlite3

import pytest

from protocol.errors import ErrorCode, storage_full


def test_enospc_from_a_real_write_is_507():
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full to write to")
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        with pytest.raises(OSError) as e:
            os.write(fd, b"x")
    finally:
        os.close(fd)
    err = storage_full(e.value)
    assert err is not None and err.code is ErrorCode.InsufficientStorage and err.status == 507


def test_sqlite_full_from_a_real_database_is_507():
    db = sqlite3.connect(":memory:")
    db.execute("PRAGMA max_page_count = 2")
    db.execute("CREATE TABLE t (v BLOB)")
    with pytest.raises(sqlite3.OperationalError) as e:
        for _ in range(100):
            db.execute("INSERT INTO t VALUES (?)", (b"x" * 4096,))
    err = storage_full(e.value)
    assert err is not None and err.code is ErrorCode.InsufficientStorage, e.value


@pytest.mark.parametrize("exc", [OSError(errno.EACCES, "denied"), OSError(errno.EIO, "io"), ValueError("full"),
                                 sqlite3.OperationalError("database is locked"), RuntimeError("disk is full")])
def test_other_failures_are_not_a_full_disk(exc):
    assert storage_full(exc) is None
