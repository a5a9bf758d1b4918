"""``objectcache bench --help`` lists the benchmarks, one line each (issue 23 item 4)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import REPO

from bench.cli import MODULES


@pytest.mark.parametrize("args", [["bench", "--help"], ["bench", "-h"]])
def test_bench_help_lists_every_benchmark_on_one_line(args):
    r = subprocess.run([sys.executable, "-m", "objectcache", *args], capture_output=True, text=True, timeout=60, cwd=REPO,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    names = [m.__name__.rsplit(".", 1)[1].replace("_", "-") for m in MODULES]  # the command is the module, dashed
    lines = {line.split()[0]: line for line in r.stdout.splitlines() if line.strip() and line.split()[0] in names}
    assert sorted(lines) == sorted(names), r.stdout
    for name, line in lines.items():
        assert len(line.split()) > 2, f"{name} has no one-line description: {line!r}"


def test_other_commands_still_refuse_unknown_arguments():
    r = subprocess.run([sys.executable, "-m", "objectcache", "serve", "--bogus"], capture_output=True, text=True, timeout=60, cwd=REPO,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr
