"""``objectcache bench <name>``: the benchmark harness entry point."""

from __future__ import annotations

import argparse

from . import capacity, cluster, cluster_sim, compression, evict, faults, memory_budget, peers, s3ops, sched, trace, transfer, ttft, vllm, wire

MODULES = [wire, transfer, ttft, sched, trace, s3ops, faults, capacity, cluster, cluster_sim, evict, peers, compression, memory_budget, vllm]


class _OneLineHelp(argparse.HelpFormatter):
    """One line per benchmark in --help, whatever the terminal's width or the longest name."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=200, max_help_position=32)

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        self._action_max_length = max(self._action_max_length, 20)  # room for every name beside its description


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="objectcache bench", description="run a benchmark (see README: Benchmarks)",
                                     formatter_class=_OneLineHelp)
    benches = parser.add_subparsers(dest="bench_name", required=True, title="benchmarks", metavar="BENCHMARK")
    for m in MODULES:
        m.add_parser(benches)
    args = parser.parse_args(argv)
    args.bench(args)
    return 0
