"""``objectcache bench compression --quick``: the report is complete and self-consistent (every codec's ratio and
decode rate, every link rate with raw, each codec and the adaptive choice, the interference modes, the top-level
TTFT fields derived from decode="auto" through a node, the cold capacity-tier kv-gets over SeaweedFS). Speed targets are the benchmark's business, not the test's."""

from __future__ import annotations

import json
import math
import subprocess
import sys

from support import REPO

from protocol.codecs import CODEC_NAMES

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def positive(x: float) -> bool:
    return x > 0 and math.isfinite(x)


def test_bench_compression_quick_report(tmp_path):
    out, png = tmp_path / "compression.json", tmp_path / "compression.png"
    r = subprocess.run([sys.executable, "-m", "objectcache", "bench", "compression", "--quick", "--json", str(out), "--plot", str(png)],
                       capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "|---|" in r.stdout
    assert png.read_bytes()[:8] == PNG_MAGIC
    result = json.loads(out.read_text())

    # Codecs: every registered one, on the (labelled) synthetic KV; lossless exact, lossy within its stated bound.
    assert result["kv"][0]["label"].startswith("synthetic") and result["real_kv"] is False and result["real_kv_note"]
    rows = {row["codec"]: row for row in result["codecs"] if row["kv"] == "synthetic-bf16"}
    assert set(rows) == set(CODEC_NAMES)
    assert rows["none"]["ratio"] == 1.0
    for name, row in rows.items():
        assert positive(row["encode_gb_s"]) and positive(row["decode_gb_s_per_core"]) and positive(row["decode_gb_s_pool"])
        assert row["lossy"] == CODEC_NAMES[name].lossy
        if row["lossy"]:
            assert row["ratio"] > 1 and row["lossless_exact"] is None and 0 < row["error_over_bound"] <= 1
        else:
            assert row["lossless_exact"] is True and row["error_over_bound"] == 0
    assert rows["zstd"]["ratio"] > 1 and rows["int4+zstd"]["ratio"] > rows["int8+zstd"]["ratio"]

    # TTFT vs link: every rate, every codec beside raw, the adaptive picks allowed ones and is reported as measured.
    sweep = result["sweep"]
    rates = [row["link_gbps"] for row in sweep["rows"]]
    assert rates == sorted(rates) and rates[0] <= 1 and rates[-1] >= 40
    assert "measured" in sweep["method"] and "modelled" in sweep["method"]
    for row in sweep["rows"]:
        assert set(row["codecs"]) == set(CODEC_NAMES)
        raw = row["codecs"]["none"]
        assert raw["ttft_s"] == row["raw_ttft_s"] and raw["speedup_vs_raw"] == 1 and raw["wire_bytes"] >= raw["raw_bytes"]
        for name, cell in row["codecs"].items():
            assert positive(cell["ttft_s"]) and positive(cell["model_ttft_s"]) and positive(cell["achieved_gbps"])
            assert cell["raw_bytes"] == raw["raw_bytes"] and cell["ttft_s"] >= cell["load_s"] > 0
        for name, cell in row["codecs"].items():  # the token bucket paces: no faster than the link, but for one piece of burst
            assert cell["achieved_gbps"] <= row["link_gbps"] * 1.1, (name, row["link_gbps"], cell["achieved_gbps"])
        assert row["codecs"]["int4+zstd"]["wire_bytes"] < row["codecs"]["zstd"]["wire_bytes"] < raw["wire_bytes"]
        for label in ("adaptive", "adaptive-lossless"):
            pick = row[label]
            assert pick["ttft_s"] == row["codecs"][pick["codec"]]["ttft_s"]
            assert pick["vs_best_fixed"] >= 1 and row["best_fixed"] in CODEC_NAMES
        assert not CODEC_NAMES[row["adaptive-lossless"]["codec"]].lossy
    told = sweep["chooser_decode_gb_s_per_worker"]  # never above what the pool decoded alone (beside_the_link)
    assert set(told) == set(CODEC_NAMES) - {"none"}
    for name, rate in told.items():
        assert 0 < rate <= round(rows[name]["decode_gb_s_pool"] / result["workers"], 4) + 1e-4, (name, rate)
    slow, fast = sweep["rows"][0], sweep["rows"][-1]
    for name, cell in slow["codecs"].items():  # what the decode pool wrote is the KV that was sent
        assert cell["byte_exact"] is (None if CODEC_NAMES[name].lossy else True), name
    assert result["model_sweep_speedup_slowest_link"] == slow["adaptive"]["speedup_vs_raw"]
    assert result["model_sweep_ratio_fastest_link"] == round(fast["adaptive"]["ttft_s"] / fast["raw_ttft_s"], 4)
    assert positive(result["model_sweep_ratio_fastest_link"]) and positive(result["model_sweep_speedup_slowest_link_lossless"])

    # Through a node: raw chunks vs the stored codec decoded in the node, in the SDK and where decode="auto" put it;
    # the headline fields are auto's (the kv-get path's own choice), the link carried what each site implies.
    node = result["node"]
    assert node["measured"] is True and node["codec"] in CODEC_NAMES and node["codec"] != "none"
    node_rates = [row["link_gbps"] for row in node["rows"]]
    assert node_rates == sorted(node_rates) and node_rates[0] <= 1 and node_rates[-1] == rates[-1]
    for row in node["rows"]:
        v = row["variants"]
        assert all(positive(v[name]["ttft_s"]) for name in ("raw", "node", "client", "auto"))
        assert v["raw"]["wire_bytes"] == node["payload_bytes"] and v["raw"]["byte_exact"] is True
        assert v["node"]["sites"] == ["node"] and v["node"]["wire_bytes"] == node["payload_bytes"]
        assert v["client"]["sites"] == ["client"] and 0 < v["client"]["wire_bytes"] < node["payload_bytes"]
        assert set(v["auto"]["sites"]) <= {"node", "client"} and v["auto"]["reason"]
        assert row["auto_vs_raw"] == round(v["raw"]["ttft_s"] / v["auto"]["ttft_s"], 4)
    assert result["ttft_ratio_fastest_link_no_copies"] == round(1 / node["rows"][-1]["auto_vs_raw"], 4)
    assert result["ttft_speedup_slowest_link_no_copies"] == node["rows"][0]["auto_vs_raw"]
    # The headline fields: a node with the default configuration (decoded copies on) at the slowest and fastest link.
    default = node["default_config"]
    assert [r["link_gbps"] for r in default] == [node_rates[0], node_rates[-1]]
    for r in default:
        v = r["variants"]
        assert r["decoded_copies_bytes"] > 0 and v["raw"]["byte_exact"] is True and v["raw"]["decoded_copies"] == 0
        # chunks never read before, their kv-put landed: copied after the put (decode_on_put), read where the node decodes
        assert v["first"]["decoded_copies"] == (node["chunks"] if v["first"]["site"] == "node" else 0), v["first"]
        assert all(0 <= n <= node["chunks"] for n in v["put_then_get"]["runs_copies"])  # racing its put's copies
        assert r["put_then_get_vs_raw"] == round(v["raw"]["ttft_s"] / v["put_then_get"]["ttft_s"], 4)
        assert r["auto_vs_raw"] == round(v["raw"]["ttft_s"] / v["auto"]["ttft_s"], 4)
        assert r["first_vs_raw"] == round(v["raw"]["ttft_s"] / v["first"]["ttft_s"], 4)
    fast = default[-1]["variants"]["auto"]
    if fast["site"] == "node":  # warm at the fastest link: every chunk from its copy, gathered like a raw chunk
        assert fast["decoded_copies"] == node["chunks"] and fast["decoded_copies_read"] == "gathered", fast
    assert result["ttft_speedup_slowest_link"] == default[0]["auto_vs_raw"] and positive(result["ttft_speedup_slowest_link"])
    assert result["ttft_ratio_fastest_link"] == round(1 / default[-1]["auto_vs_raw"], 4)
    assert result["ttft_ratio_fastest_link_first_get"] == round(1 / default[-1]["first_vs_raw"], 4)
    assert result["ttft_ratio_fastest_link_put_then_get"] == round(1 / default[-1]["put_then_get_vs_raw"], 4)

    # Interference: alone, in the engine's process, in the node's; the decoders really decoded.
    modes = [row["mode"] for row in result["interference"]["rows"]]
    assert modes == ["alone", "decode in engine process", "decode in node process"]
    alone, engine, node = result["interference"]["rows"]
    assert alone["compute_slowdown"] == 0 and alone["decode_gb_s"] == 0
    assert all(positive(row["compute_iters_per_s"]) and positive(row["decode_gb_s"]) for row in (engine, node))
    assert result["interference"]["codec"] in CODEC_NAMES

    # Cold capacity tier: real nodes over SeaweedFS; the upstream link carried the compressed bytes, decoded byte-exact.
    cold = result["capacity_cold"]
    assert cold["measured"] is True and cold["upstream"] == "seaweedfs", cold
    got = {row["codec"]: row for row in cold["rows"]}
    assert set(got) == {"none", "zstd", "int4+zstd"}
    assert got["none"]["upstream_bytes"] == got["none"]["raw_bytes"] > got["zstd"]["upstream_bytes"] > got["int4+zstd"]["upstream_bytes"] > 0
    assert got["none"]["byte_exact"] is True and got["zstd"]["byte_exact"] is True and got["int4+zstd"]["byte_exact"] is None
    assert all(positive(row["cold_ms"]) and positive(row["speedup_vs_raw"]) for row in got.values()) and got["none"]["speedup_vs_raw"] == 1
    assert set(result["targets"]) and all(isinstance(v, bool) for v in result["targets"].values())


def test_bench_compression_only_node_gives_the_headline_fields_alone(tmp_path):
    out = tmp_path / "node.json"
    r = subprocess.run([sys.executable, "-m", "objectcache", "bench", "compression", "--quick", "--only", "node", "--json", str(out)],
                       capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=600)
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    assert result["only"] == "node" and "sweep" not in result and "interference" not in result
    default = result["node"]["default_config"]
    assert result["ttft_ratio_fastest_link"] == round(1 / default[-1]["auto_vs_raw"], 4)
    assert result["ttft_ratio_fastest_link_no_copies"] == round(1 / result["node"]["rows"][-1]["auto_vs_raw"], 4)
    assert positive(result["ttft_speedup_slowest_link"]) and set(result["fields"]) >= {"ttft_ratio_fastest_link", "ttft_ratio_fastest_link_first_get"}


def test_the_chooser_is_told_the_slower_of_the_pools_rate_alone_and_beside_the_link():
    from bench.compression import beside_the_link
    from scheduler.codec_choice import CodecProfile

    alone = [CodecProfile("int8", 1.9, 1.0e9, lossy=True), CodecProfile("zstd", 1.5, 0.2e9)]
    measured = {"int8": {40.0: {"raw_bytes": 64 << 20, "load_s": 0.1}}, "zstd": {40.0: {"raw_bytes": 64 << 20, "load_s": 0.1}}}
    told = {p.name: p for p in beside_the_link(alone, measured, 40.0, workers=2)}
    assert told["int8"].decode_bytes_per_s_per_core == (64 << 20) / 0.1 / 2  # the pool beside the link was slower
    assert told["zstd"].decode_bytes_per_s_per_core == 0.2e9  # alone was slower: kept
    assert told["int8"].ratio == 1.9 and told["int8"].lossy
