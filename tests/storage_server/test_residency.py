"""Cold chunks: a sampled page-cache miss is seen without reading anything, and the read-ahead brings the chunks in."""

from __future__ import annotations

import os
import time

from pagecache import evict_fds

from storage_server.residency import read_ahead, read_ahead_budget, resident_fraction


def test_a_dropped_chunk_is_seen_cold_and_read_ahead_warms_it(tmp_path):
    paths = []
    for i in range(4):
        p = tmp_path / f"chunk{i}"
        with open(p, "wb") as f:
            f.write(bytes([i]) * (256 << 10))
            f.flush()
            os.fsync(f.fileno())  # clean pages: DONTNEED can drop them
        paths.append(p)
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    try:
        offsets = [0] * 4
        for fd in fds:
            os.pread(fd, 1, 0)
        assert resident_fraction(fds, offsets) == 1.0
        evict_fds(fds[2:])
        assert resident_fraction(fds, offsets) == 0.5  # two of four sampled chunks are cold
        assert read_ahead_budget() > 0
        assert read_ahead(fds, offsets, [256 << 10] * 4, budget=3 * (256 << 10)) == 3 * (256 << 10)  # bounded by the budget
        assert read_ahead(fds[2:], offsets[2:], [256 << 10] * 2, budget=1 << 30) == 2 * (256 << 10)
        deadline = time.monotonic() + 10
        while resident_fraction(fds, offsets) < 1.0 and time.monotonic() < deadline:
            time.sleep(0.01)  # the kernel reads ahead asynchronously
        assert resident_fraction(fds, offsets) == 1.0
        assert [os.pread(fd, 1, 1000) for fd in fds] == [bytes([i]) for i in range(4)]
    finally:
        for fd in fds:
            os.close(fd)


def test_probing_a_cold_chunk_does_not_warm_it(tmp_path):
    """The sample only looks: asking twice about a dropped chunk finds it cold twice (a read-based probe would start
    read-ahead of the very page it asked about)."""
    p = tmp_path / "chunk"
    p.write_bytes(b"\x07" * (256 << 10))
    fd = os.open(p, os.O_RDONLY)
    try:
        evict_fds([fd])
        assert [resident_fraction([fd], [0]) for _ in range(3)] == [0.0, 0.0, 0.0]
        time.sleep(0.05)  # long enough for a read-ahead, had one been started, to land
        assert resident_fraction([fd], [0]) == 0.0
        assert os.pread(fd, 1, 0) == b"\x07"
        assert resident_fraction([fd], [0]) == 1.0
    finally:
        os.close(fd)
