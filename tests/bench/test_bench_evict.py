"""``objectcache bench evict``: the replay tool's report, and the default (learnt) and prefix policies against LRU and Belady on traces
other than the bundled sample (synthetic Mooncake-format traces of other seeds and shapes), so the policy is not
tuned to the one sample."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support import REPO

from bench.evict_sim import synthetic_trace

FRACTIONS = (0.05, 0.1, 0.2)


def run_evict(tmp_path: Path, *traces: str) -> dict:
    out = tmp_path / "evict.json"
    r = subprocess.run([sys.executable, "-m", "objectcache", "bench", "evict", *traces, "--json", str(out)],
                       capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "|---|" in r.stdout
    return json.loads(out.read_text())


def ratios(result: dict, trace: str) -> dict[tuple[str, float], float]:
    return {(r["policy"], r["cache_fraction"]): r["token_hit_ratio"] for r in result["rows"] if r["trace"].endswith(trace)}


def test_the_report_on_the_bundled_sample_has_every_policy_beside_belady(tmp_path: Path):
    result = run_evict(tmp_path)
    assert result["default_policy"] == "reuse"
    got = ratios(result, "mooncake_synthetic_trace_sample.jsonl")
    assert set(got) == {(p, f) for p in ("lru", "prefix", "reuse", "belady") for f in FRACTIONS}
    for f in FRACTIONS:
        for policy in ("prefix", "reuse"):
            assert got[("belady", f)] >= got[(policy, f)] >= got[("lru", f)] > 0, (policy, f, got)
    assert all(r["bytes_fetched"] > 0 for r in result["rows"])
    assert result["targets"]["reuse never below LRU"]


def test_on_other_trace_shapes_the_learnt_and_the_prefix_policy_never_fall_below_lru(tmp_path: Path):
    shapes = {"few-roots.jsonl": synthetic_trace(seed=11, requests=500, roots=3, conversations=40, one_off_share=0.25),
              "many-one-offs.jsonl": synthetic_trace(seed=23, requests=500, roots=10, conversations=80, one_off_share=0.6,
                                                     tail_blocks=(20, 120))}
    for name, rows in shapes.items():
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_evict(tmp_path, *(str(tmp_path / n) for n in shapes))
    for name in shapes:
        got = ratios(result, name)
        for f in FRACTIONS:
            lru, best = got[("lru", f)], got[("belady", f)]
            for policy in ("reuse", "prefix"):
                assert best >= got[(policy, f)] >= lru, (name, f, policy, lru, got[(policy, f)], best)
