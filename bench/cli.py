"""``objectcache bench <name>``: the benchmark harness entry point."""

from __future__ import annotations

import argparse

from . import capacity, evict, faults, s3ops, sched, trace, transfer, ttft, wire

MODULES = [wire, transfer, ttft, sched, trace, s3ops, faults, capacity, evict]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="objectcache bench", description="run a benchmark (see README: Benchmarks)")
    benches = parser.add_subparsers(dest="bench_name", required=True)
    for m in MODULES:
        m.add_parser(benches)
    args = parser.parse_args(argv)
    args.bench(args)
    return 0
