"""``objectcache bench vllm --quick``: real vLLM (the tiny model) over ObjectCache's connector beside recompute and vLLM's own hit.

Checks the report, not the speed: every path ran, the prefix was served from where it should
(recompute: nothing cached; vLLM's own prefix cache and the connector: exactly the hit's tokens),
the first tokens are identical across paths, and the headline ratios are there and finite.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys

import pytest
from support import REPO

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install 'objectcache[vllm]'; make test does)")


@pytest.mark.timeout(1800)  # five vLLM engine processes; each start takes minutes on a loaded two-core machine
def test_bench_vllm_quick(tmp_path):
    out, png = tmp_path / "result.json", tmp_path / "result.png"
    r = subprocess.run([sys.executable, "-m", "objectcache", "bench", "vllm", "--quick", "--json", str(out), "--plot", str(png)],
                       capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=1500)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "|---|" in r.stdout and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = json.loads(out.read_text())
    assert result["model"]["size"] == "tiny" and result["tokens_identical"] is True
    assert [(row["tokens"], row["hit"]) for row in result["rows"]] == [(1024, 0.5), (1024, 0.875)]
    for row in result["rows"]:
        paths = row["paths"]
        assert set(paths) == {"recompute", "local-hit", "shm"}
        hit_tokens = int(row["tokens"] * row["hit"])
        assert paths["recompute"]["cached_tokens"] == 0
        assert paths["local-hit"]["cached_tokens"] == hit_tokens, "vLLM's own prefix cache did not hold the prefix"
        assert paths["shm"]["cached_tokens"] == hit_tokens, "the connector did not load exactly the stored prefix"
        assert len({p["first_token"] for p in paths.values()}) == 1
        assert all(p["ttft_s"] > 0 for p in paths.values())
    for key in ("ttft_vs_local_hit_max", "speedup_vs_recompute_min"):
        assert result[key] > 0 and math.isfinite(result[key]), key
    assert set(result["transports_skipped"]) == {"http", "rdma"}


def test_transports_always_include_the_headline_and_refuse_unknown_names():
    import argparse

    from bench.vllm import _transports

    assert _transports("http") == "shm,http"  # shm is the headline: always timed, first
    assert _transports("rdma,shm,http") == "shm,http,rdma"
    with pytest.raises(argparse.ArgumentTypeError, match="unknown transports \\['tcp'\\]"):
        _transports("shm,tcp")
