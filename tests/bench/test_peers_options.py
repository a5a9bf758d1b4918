"""``bench peers --cases / --paths``: the narrow reruns of chosen rows and paths parse as the help says."""

import argparse

import pytest

from bench.peers import OBJECTCACHE_PATHS, _cases, _paths


def test_cases_parse_g_by_n_pairs():
    assert _cases("64x64,256x64") == [(64, 64), (256, 64)]
    assert _cases("16×3584") == [(16, 3584)]
    with pytest.raises(argparse.ArgumentTypeError):
        _cases("64-64")


def test_paths_are_a_subset_of_objectcache_paths():
    assert _paths("shm-local") == ["shm-local"]
    assert _paths(",".join(OBJECTCACHE_PATHS)) == list(OBJECTCACHE_PATHS)
    with pytest.raises(argparse.ArgumentTypeError, match="unknown path"):
        _paths("shm,nvme")
