"""``objectcache bench evict TRACE…``: every eviction policy and the Belady bound replayed offline on Mooncake-format traces.

Caches of ``--cache-fraction`` of each trace's working set (distinct 512-token blocks);
per policy the token hit ratio, its share of Belady's, how much of the LRU→Belady gap
it closes, and the KV bytes fetched (missed tokens × ``--bytes-per-token``, which a
node fetches from its upstream or an engine recomputes). Pure replay (see
:mod:`bench.evict_sim`): seconds per trace.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from storage_server.store.cache.policy import DEFAULT_POLICY, POLICIES

from .evict_sim import load, replay, working_set
from .harness import add_bench_parser, finish, grouped_bars, print_table, print_targets
from .trace import SAMPLE, _display_path

FRACTIONS = (0.05, 0.10, 0.20)
# Llama-3-8B in fp16: 32 layers × 8 KV heads × 128 dims × (K, V) × 2 bytes.
BYTES_PER_TOKEN = 131072


def run(args: argparse.Namespace) -> dict:
    rows: list[dict] = []
    traces = [str(SAMPLE)] if not args.trace else args.trace
    names = ["belady", *POLICIES]
    for file in traces:
        trace = load(Path(file))
        if args.quick:
            trace = trace[:60]
        blocks = working_set(trace)
        print(f"\n{_display_path(file)}: {len(trace)} requests, working set {blocks} blocks")
        table = []
        for fraction in args.cache_fraction:
            got = {name: replay(trace, name, fraction) for name in names}
            lru, best = got["lru"].token_hit_ratio, got["belady"].token_hit_ratio
            for name in names:
                r = got[name]
                gap = (r.token_hit_ratio - lru) / (best - lru) if best > lru else None
                row = {"trace": _display_path(file), "policy": name, "cache_fraction": fraction, "capacity_blocks": r.capacity_blocks,
                       "token_hit_ratio": round(r.token_hit_ratio, 6),
                       "share_of_belady": round(r.token_hit_ratio / best, 4) if best else None,
                       "lru_gap_closed": None if gap is None else round(gap, 4),
                       "bytes_fetched": r.missed_tokens * args.bytes_per_token, "evictions": r.evictions}
                rows.append(row)
                table.append([f"{fraction:.0%}", name, f"{r.token_hit_ratio:.4f}", "-" if not best else f"{r.token_hit_ratio / best:.0%}",
                              "-" if gap is None or name in ("lru", "belady") else f"{gap:.0%}",
                              f"{row['bytes_fetched'] / 1e9:.1f}"])
        print_table(["cache", "policy", "token hit ratio", "of Belady", "LRU→Belady gap closed", "GB fetched"], table)
    result = {"bench": "evict", "default_policy": DEFAULT_POLICY, "block_tokens": 512, "bytes_per_token": args.bytes_per_token,
              "policies": names, "rows": rows}
    result["targets"] = targets(result)
    print_targets(result["targets"])
    return finish(args, result, plot)


def targets(result: dict) -> dict[str, bool]:
    """Issue 28's goals for the default policy, over every trace and size replayed."""
    mine = [r for r in result["rows"] if r["policy"] == result["default_policy"]]
    lru = {(r["trace"], r["cache_fraction"]): r["token_hit_ratio"] for r in result["rows"] if r["policy"] == "lru"}
    small = [r for r in mine if r["cache_fraction"] <= 0.10 + 1e-9 and r["lru_gap_closed"] is not None]
    return {f"{result['default_policy']} never below LRU": all(r["token_hit_ratio"] >= lru[(r["trace"], r["cache_fraction"])] for r in mine),
            f"{result['default_policy']} closes at least half the LRU→Belady gap at caches ≤ 10%": all(r["lru_gap_closed"] >= 0.5 for r in small)}


def plot(result: dict, fig) -> None:
    """Token hit ratio per cache size, one bar per policy, one panel per trace."""
    traces = list(dict.fromkeys(r["trace"] for r in result["rows"]))
    for i, trace in enumerate(traces):
        ax = fig.add_subplot(1, len(traces), i + 1)
        rows = [r for r in result["rows"] if r["trace"] == trace]
        fractions = list(dict.fromkeys(r["cache_fraction"] for r in rows))
        series = {p: [next(r["token_hit_ratio"] for r in rows if r["policy"] == p and r["cache_fraction"] == f) for f in fractions]
                  for p in result["policies"]}
        grouped_bars(ax, [f"{f:.0%} of working set" for f in fractions], series, rotation=0)
        ax.set_title(Path(trace).name, fontsize=9)
        ax.set_ylabel("token hit ratio")
        ax.legend()


def add_parser(sub) -> None:
    p = add_bench_parser(sub, "evict", "replay Mooncake-format traces through every eviction policy and the Belady bound", run)
    p.add_argument("trace", nargs="*", help="trace files (default: the bundled 200-request sample)")
    p.add_argument("--cache-fraction", type=float, nargs="+", default=list(FRACTIONS),
                   help="cache sizes as fractions of each trace's working set (default: 0.05 0.1 0.2)")
    p.add_argument("--bytes-per-token", type=int, default=BYTES_PER_TOKEN, help="KV bytes per token for 'GB fetched' (Llama-3-8B fp16)")
