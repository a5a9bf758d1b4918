"""``objectcache bench cluster-sim``: a flow-level cluster simulator for choosing KV paths and engines.

Two settings, each from its paper (see ``cluster_sim_netkv`` and ``cluster_sim_dualpath``):

* **NetKV**: decode-instance selection on a 64-GPU four-tier fat-tree, workloads
  (chatbot, RAG, long context) from a Mooncake-format trace, loads as fractions of
  the prefill pool's capacity, the default fabric (4:1, 20% background) and
  NetKV's stress corner (8:1, 40%). Policies: round-robin, load-aware,
  cache-aware, cache+load-aware (weight tuned on another seed), NetKV with the
  static tier map only, NetKV full (plus self-contention and the 1 s congestion
  oracle), DualPath's token balancing, and ours (``scheduler.choose_path`` per
  candidate, which may split a transfer with the warmest peer).
* **DualPath**: an offline agentic batch whose hit KV is read through the prefill
  side only, DualPath's shorter-queue side, or ours (either side or a split).

Reported: mean/p50/p99 TTFT, SLO attainment, throughput, per-tier utilisation,
and the comparisons with each paper's figures. Nothing is tuned to hit them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from . import cluster_sim_dualpath as dualpath
from . import cluster_sim_netkv as netkv
from .cluster_sim_models import PROFILES, agentic_records, load_records, workload
from .harness import add_bench_parser, finish, grouped_bars, print_table
from .trace import SAMPLE, _display_path

PAPER = {
    "netkv_vs_round_robin": 0.212,  # up to, mean TTFT (RAG at 200% load)
    "netkv_vs_cache_load": 0.176,  # up to (RAG, 16K inputs)
    "static_tier_share": 0.90,  # of NetKV's gain, from the static tier map alone (Table IV: 0.91 / 0.86 / 0.93)
    "dualpath_throughput_ratio": 1.87,  # up to, offline (DS 660B, 2P4D)
}
CLA_WEIGHTS = (0.2, 0.5, 0.8)
SHORT = {"round-robin": "RR", "load-aware": "LA", "cache-aware": "CA", "cache+load-aware": "CLA", "netkv-static": "NetKV-static",
         "netkv-full": "NetKV-full", "dualpath": "DualPath", "ours": "ours", "single-path": "single path"}


def netkv_cells(args: argparse.Namespace) -> list[dict]:
    records = load_records(Path(args.trace))
    profiles = ["rag"] if args.quick else list(PROFILES)
    loads = [0.7] if args.quick else [0.5, 0.9]
    fabrics = [("default", 4.0, 0.2)] + ([] if args.quick else [("stress", 8.0, 0.4)])
    n = 60 if args.quick else args.requests
    cells = []
    for name in profiles:
        profile = PROFILES[name]
        capacity = netkv.capacity_rps(workload(records, profile, 1.0, 1000.0, 0))
        weight = tune_cla(records, profile, capacity * loads[-1], n, args)  # once per workload, at the highest load
        for fabric, oversub, background in fabrics:
            for load in (loads if fabric == "default" else loads[-1:]):
                rate = capacity * load
                duration = n / rate
                warmup = 0.15 * duration
                requests = workload(records, profile, rate, duration, args.seed)
                results = {p: netkv.simulate(requests, profile, p, background, args.seed, warmup, duration, weight, oversub)
                           for p in netkv.POLICIES}
                cells.append({"profile": name, "fabric": fabric, "oversubscription": oversub, "background": background,
                              "load": load, "rate_rps": rate, "cla_weight": weight, "slo_s": profile.slo_s, "policies": results})
    return cells


def tune_cla(records, profile, rate: float, n: int, args) -> float:
    """CLA*'s weight, picked by mean TTFT on another seed of the workload on the default fabric (NetKV tuned CLA* likewise)."""
    if args.quick:
        return 0.5
    duration = n / rate
    requests = workload(records, profile, rate, duration, args.seed + 1000)
    scores = {w: netkv.simulate(requests, profile, "cache+load-aware", 0.2, args.seed + 1000, 0.15 * duration, duration, w, 4.0)["mean_ttft_s"]
              for w in CLA_WEIGHTS}
    return min(scores, key=lambda w: (scores[w], w))


def dualpath_cells(args: argparse.Namespace) -> list[dict]:
    configs = [(1, 1)] if args.quick else [(1, 2)]  # 1P2D: the P:D ratio of the paper's 2P4D
    agents = 48 if args.quick else args.agents
    records = agentic_records(agents, (49152, 57344), 65536, args.seed)
    cells = []
    for p, d in configs:
        results = {pol: dualpath.simulate(records, pol, p, d) for pol in dualpath.POLICIES}
        base = results["single-path"]["throughput_tokens_per_s"]
        for r in results.values():
            r["throughput_vs_single_path"] = r["throughput_tokens_per_s"] / base
        cells.append({"config": f"{p}P{d}D", "agents": agents, "turns": len(records), "policies": results})
    return cells


def reduction(base: float, new: float) -> float:
    return (base - new) / base if base > 0 else 0.0


def headline(net: list[dict], dp: list[dict]) -> dict:
    """The fields the issue names, each computed from the runs (never set by hand)."""
    def mean(cell, pol):
        return cell["policies"][pol]["mean_ttft_s"]

    default = [c for c in net if c["fabric"] == "default"]  # the paper's load sweep; the stress corner is reported beside it
    vs_rr = max(reduction(mean(c, "round-robin"), mean(c, "netkv-full")) for c in default)
    vs_cla = max(reduction(mean(c, "cache+load-aware"), mean(c, "netkv-full")) for c in default)
    # NetKV's ablation (Table IV): the static tier map's part of the full gain over CLA, summed over the default cells.
    static_gain = sum(mean(c, "cache+load-aware") - mean(c, "netkv-static") for c in default)
    full_gain = sum(mean(c, "cache+load-aware") - mean(c, "netkv-full") for c in default)
    ours = []
    for c in [*net, *dp]:
        others = {p: v["mean_ttft_s"] for p, v in c["policies"].items() if p != "ours"}
        best = min(others, key=others.get)
        ours.append({"cell": c.get("config") or f"{c['profile']}/{c['fabric']}/{c['load']:.0%}", "best_other": best,
                     "reduction": reduction(others[best], c["policies"]["ours"]["mean_ttft_s"])})
    worst = min(ours, key=lambda o: o["reduction"])
    return {
        "netkv_vs_round_robin": vs_rr,
        "netkv_vs_cache_load": vs_cla,
        "static_tier_share": static_gain / full_gain if full_gain > 0 else None,
        "dualpath_throughput_ratio": max(c["policies"]["dualpath"]["throughput_vs_single_path"] for c in dp),
        "ours_vs_best_baseline": worst["reduction"],
        "ours_vs_best_by_cell": ours,
        "stress_netkv_vs_cache_load": max((reduction(mean(c, "cache+load-aware"), mean(c, "netkv-full")) for c in net if c["fabric"] == "stress"),
                                          default=None),
        "ours_better_somewhere": any(o["reduction"] > 1e-6 for o in ours),
    }


def run(args: argparse.Namespace) -> dict:
    started, cpu = time.perf_counter(), time.process_time()
    net = netkv_cells(args)
    cpu_netkv = time.process_time() - cpu
    dp = dualpath_cells(args)
    cpu_dualpath = time.process_time() - cpu - cpu_netkv
    head = headline(net, dp)
    print(f"NetKV setting: 64 GPUs, 4 prefill + 12 decode instances (TP=4), trace {Path(args.trace).name}\n")
    for c in net:
        print(f"{c['profile']} · {c['fabric']} fabric ({c['oversubscription']:.0f}:1, {c['background']:.0%} background) · "
              f"load {c['load']:.0%} of prefill capacity ({c['rate_rps']:.2f} req/s), TTFT SLO {c['slo_s']:.0f} s\n")
        print_table(["policy", "mean TTFT s", "p50 s", "p99 s", "SLO", "goodput req/s", "transfer s", "same-pod : cross-pod"],
                    [[SHORT[p], f"{v['mean_ttft_s']:.3f}", f"{v['p50_ttft_s']:.3f}", f"{v['p99_ttft_s']:.3f}", f"{v['slo_attainment']:.1%}",
                      f"{v['goodput_rps']:.2f}", f"{v['mean_transfer_s']:.3f}",
                      f"{v['transfer_tier_share']['same_zone']:.0%} : {v['transfer_tier_share']['cross_zone']:.0%}"]
                     for p, v in c["policies"].items()])
        print()
    print("DualPath setting: offline agentic batch, 8 GPUs per node, one 400 Gbps storage NIC per node\n")
    for c in dp:
        print(f"{c['config']}: {c['agents']} agents, {c['turns']} turns\n")
        print_table(["read path", "JCT s", "tokens/s", "vs single path", "mean TTFT s", "p99 TTFT s", "storage NIC util P / D"],
                    [[SHORT[p], f"{v['jct_s']:.1f}", f"{v['throughput_tokens_per_s']:.3g}", f"{v['throughput_vs_single_path']:.2f}×",
                      f"{v['mean_ttft_s']:.3f}", f"{v['p99_ttft_s']:.3f}",
                      f"{v['storage_nic_utilisation']['prefill_nodes']:.0%} / {v['storage_nic_utilisation']['decode_nodes']:.0%}"]
                     for p, v in c["policies"].items()])
        print()
    share = head["static_tier_share"]
    print_table(["figure", "paper", "this simulator"], [
        ["NetKV mean-TTFT reduction vs round-robin (up to)", f"{PAPER['netkv_vs_round_robin']:.1%}", f"{head['netkv_vs_round_robin']:.1%}"],
        ["NetKV mean-TTFT reduction vs cache+load-aware (up to)", f"{PAPER['netkv_vs_cache_load']:.1%}", f"{head['netkv_vs_cache_load']:.1%}"],
        ["static tier map's share of NetKV's gain", f"≈{PAPER['static_tier_share']:.0%}", "n/a" if share is None else f"{share:.0%}"],
        ["DualPath offline throughput vs one load path (up to)", f"{PAPER['dualpath_throughput_ratio']:.2f}×", f"{head['dualpath_throughput_ratio']:.2f}×"],
        ["ours vs the best other policy (worst cell)", "—", f"{head['ours_vs_best_baseline']:+.1%}"],
    ])
    elapsed = time.perf_counter() - started
    print(f"\nsimulated in {elapsed:.1f} s ({cpu_netkv:.1f} + {cpu_dualpath:.1f} s of CPU for the NetKV and DualPath settings)")
    result = {"benchmark": "cluster-sim", "quick": args.quick, "trace": _display_path(args.trace), "seed": args.seed,
              **{k: v for k, v in head.items()}, "paper": PAPER, "netkv": net, "dualpath": dp, "wall_s": elapsed,
              "cpu_s": {"netkv": cpu_netkv, "dualpath": cpu_dualpath}}
    return finish(args, result, plot)


def plot(result: dict, fig) -> None:
    (a, b), (c, d) = fig.subplots(2, 2)
    net = result["netkv"]
    mid = [x for x in net if x["fabric"] == "default"]
    loads = sorted({x["load"] for x in mid})
    pick = [x for x in mid if x["load"] == loads[-1]]
    policies = list(netkv.POLICIES)
    grouped_bars(a, [SHORT[p] for p in policies], {x["profile"]: [x["policies"][p]["mean_ttft_s"] / x["policies"]["round-robin"]["mean_ttft_s"]
                                                                   for p in policies] for x in pick})
    a.set_ylabel("mean TTFT / round-robin's")
    a.set_title(f"NetKV setting, load {loads[-1]:.0%} (default fabric)")
    a.legend(fontsize=7)
    for profile in sorted({x["profile"] for x in mid}):
        xs = [x for x in mid if x["profile"] == profile]
        b.plot([x["load"] for x in xs], [reduction(x["policies"]["round-robin"]["mean_ttft_s"], x["policies"]["netkv-full"]["mean_ttft_s"]) for x in xs],
               marker="o", label=f"{profile} vs RR")
        b.plot([x["load"] for x in xs], [reduction(x["policies"]["cache+load-aware"]["mean_ttft_s"], x["policies"]["netkv-full"]["mean_ttft_s"]) for x in xs],
               marker="s", linestyle="--", label=f"{profile} vs CLA")
    b.axhline(PAPER["netkv_vs_round_robin"], color="grey", linewidth=0.8)
    b.axhline(PAPER["netkv_vs_cache_load"], color="grey", linewidth=0.8, linestyle="--")
    b.set_xlabel("load (fraction of prefill capacity)")
    b.set_ylabel("NetKV-full mean-TTFT reduction")
    b.set_title("NetKV's gain (grey: the paper's up-to figures)")
    b.legend(fontsize=6)
    tiers = ["same_zone", "cross_zone"]
    grouped_bars(c, [SHORT[p] for p in policies], {t: [float(np.mean([x["policies"][p]["transfer_tier_share"][t] for x in pick])) for p in policies]
                                                    for t in tiers})
    c.set_ylabel("share of transfers")
    c.set_title("tier shifting: same pod vs across pods")
    c.legend(fontsize=7)
    dp = result["dualpath"]
    grouped_bars(d, [x["config"] for x in dp], {SHORT[p]: [x["policies"][p]["throughput_vs_single_path"] for x in dp] for p in dualpath.POLICIES},
                 rotation=0)
    d.axhline(PAPER["dualpath_throughput_ratio"], color="grey", linewidth=0.8)
    d.set_ylabel("offline throughput / single path's")
    d.set_title("DualPath setting (grey: the paper's 1.87×)")
    d.legend(fontsize=7)
    fig.suptitle("bench cluster-sim: flow-level simulation, one seed")


def add_parser(sub) -> None:
    p = add_bench_parser(sub, "cluster-sim", "flow-level cluster simulator: NetKV's and DualPath's settings, their policies and ours", run)
    p.add_argument("--trace", default=str(SAMPLE), help="Mooncake-format trace for the NetKV workloads (default: the bundled sample)")
    p.add_argument("--requests", type=int, default=200, help="requests per NetKV run")
    p.add_argument("--agents", type=int, default=160, help="agents in the DualPath offline batch")
    p.add_argument("--seed", type=int, default=1)
