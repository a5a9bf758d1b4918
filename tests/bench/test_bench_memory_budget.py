"""bench memory-budget's read-path labels (NAME[@WINDOW_BYTES]: the server configuration each run gets) and its eviction
of only the store's chunk files from the page cache (real files; the cgroup runs themselves need root and are a bench)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from bench.memory_budget import _read_paths, _server_toml, _share, evict_files
from protocol.config.load import load_config
from storage_server.residency import page_cached


def test_labels_name_a_read_path_and_optionally_the_read_ahead_window(tmp_path: Path):
    assert _read_paths("page-cache,direct,planner,planner@0") == ["page-cache", "direct", "planner", "planner@0"]
    assert _server_toml("planner") == '[storage_server]\nread_path = "planner"\n'
    assert _server_toml("planner@0") == '[storage_server]\nread_path = "planner"\nread_ahead_window_bytes = 0\n'
    config = tmp_path / "node.toml"
    config.write_text(_server_toml("planner@0"))
    ss = load_config(config, env={}).storage_server  # what the server is started with is a configuration it accepts
    assert (ss.read_path, ss.read_ahead_window_bytes) == ("planner", 0)
    for bad in ("fastest", "planner@x", "planner@-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            _read_paths(bad)


def test_only_the_chunk_files_leave_the_page_cache(tmp_path: Path):
    big, small = tmp_path / "chunk", tmp_path / "index.sqlite"
    big.write_bytes(os.urandom(1 << 20))
    small.write_bytes(os.urandom(4096))
    fds = [os.open(p, os.O_RDONLY) for p in (big, small)]
    try:
        for fd in fds:
            os.fsync(fd)
            os.pread(fd, 4096, 0)
        if not all(page_cached(fd, 0) for fd in fds):
            pytest.skip("the page cache does not keep these files")
        evict_files(tmp_path, min_bytes=1 << 20)
        assert not page_cached(fds[0], 0) and page_cached(fds[1], 0)
    finally:
        for fd in fds:
            os.close(fd)


def test_the_hit_share_is_above_zero_and_at_most_one():
    assert _share("0.875") == 0.875 and _share("1") == 1.0
    for bad in ("0", "-0.5", "1.5", "half"):
        with pytest.raises(argparse.ArgumentTypeError, match="--hit"):
            _share(bad)
