"""Every benchmark runs in --quick mode and writes valid JSON, so the harness never rots."""

from __future__ import annotations

import json
import subprocess
import sys

from support import REPO


def run_bench(*args: str, tmp_path) -> dict:
    out = tmp_path / "result.json"
    r = subprocess.run([sys.executable, "-m", "gateway.cli", "bench", *args, "--quick", "--json", str(out)],
                       capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "|" in r.stdout  # a Markdown table
    return json.loads(out.read_text())


def test_bench_wire(tmp_path):
    result = run_bench("wire", tmp_path=tmp_path)
    assert [row["chunk_tokens"] for row in result["rows"]] == [16, 64, 256]
    assert all(row["encode_us_per_1k_keys"] > 0 and row["decode_us_per_1k_keys"] > 0 for row in result["rows"])


def test_bench_sched(tmp_path):
    result = run_bench("sched", tmp_path=tmp_path)
    assert set(result["allocation_ms"]) == {"equal", "kv-prop", "bw-prop", "stall-opt", "calibrated-stall-opt"}
    assert len(result["pacing"]) == 3 and all(r["allocated_gbps"] > 0 and r["delivered_gbps"] > 0 for r in result["pacing"])


def test_bench_trace(tmp_path):
    result = run_bench("trace", tmp_path=tmp_path)
    assert result["requests"] == 60
    assert 0 < result["hit_ratio"] < 1 and result["bytes_fetched"] > 0 and result["bytes_written"] > 0
    assert 0 < result["ttft_s"]["p50"] <= result["ttft_s"]["p90"] <= result["ttft_s"]["p99"]


def test_bench_s3ops(tmp_path):
    result = run_bench("s3ops", tmp_path=tmp_path)
    combos = {(r["size"], r["concurrency"], r["op"]) for r in result["rows"]}
    assert combos == {(s, c, o) for s in ("4KiB", "1MiB") for c in (1, 16) for o in ("put", "get")}
    assert all(r["objectcache"]["ops_per_s"] > 0 and r["moto"]["ops_per_s"] > 0 for r in result["rows"])


def test_bench_transfer(tmp_path):
    result = run_bench("transfer", tmp_path=tmp_path)
    (row,) = result["rows"]
    assert set(row["paths"]) == {"opt-local", "S3-CW", "S3-range", "ObjectCache-http", "ObjectCache-shm"}
    assert row["paths"]["S3-range"]["requests"] == row["chunks"] * 32 and row["paths"]["ObjectCache-shm"]["requests"] == 1
    assert all(p["gb_per_s"] > 0 for p in row["paths"].values())
