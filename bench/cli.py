"""``objectcache bench <name>``: the benchmark harness entry point."""

from __future__ import annotations


from . import s3ops, sched, trace, transfer, ttft, wire

MODULES = [wire, transfer, ttft, sched, trace, s3ops]


def add_subcommand(sub) -> None:
    p = sub.add_parser("bench", help="run a benchmark (see README: Benchmarks)")
    benches = p.add_subparsers(dest="bench_name", required=True)
    for m in MODULES:
        m.add_parser(benches)
    p.set_defaults(func=lambda args: (args.bench(args), 0)[1])
