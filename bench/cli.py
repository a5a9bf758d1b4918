"""``objectcache bench <name>``: the benchmark harness entry point."""

from __future__ import annotations

import argparse

from . import capacity, cluster, cluster_sim, evict, faults, peers, s3ops, sched, trace, transfer, ttft, wire

MODULES = [wire, transfer, ttft, sched, trace, s3ops, faults, capacity, cluster, cluster_sim, evict, peers]


def main(argv: list[str]) -> int:
    # One line per benchmark in --help, whatever the terminal's width.
    parser = argparse.ArgumentParser(prog="objectcache bench", description="run a benchmark (see README: Benchmarks)",
                                     formatter_class=lambda prog: argparse.HelpFormatter(prog, width=200, max_help_position=16))
    benches = parser.add_subparsers(dest="bench_name", required=True, title="benchmarks", metavar="BENCHMARK")
    for m in MODULES:
        m.add_parser(benches)
    args = parser.parse_args(argv)
    args.bench(args)
    return 0
