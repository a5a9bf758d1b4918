"""A benchmark killed by a timeout (SIGKILL: no ``finally`` runs) leaves no server behind: its children end with it,
even ones started from a pool thread that ended long before (PR_SET_PDEATHSIG follows the forking thread)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from support import REPO

# The "benchmark": moto (on the port it binds itself) and a plain child, each started from a pool thread that then ends.
BENCH = textwrap.dedent("""
    import subprocess, sys
    from concurrent.futures import ThreadPoolExecutor
    from objectcache.lifeline import spawn
    from bench.upstreams import Moto
    with ThreadPoolExecutor(2) as pool:
        moto = pool.submit(lambda: Moto().start()).result()
        sleeper = pool.submit(lambda: spawn(["sleep", "600"], start_new_session=True)).result()
    print("PIDS", moto.procs[0].pid, sleeper.pid, moto.endpoint, flush=True)
    sys.stdin.read()
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie has ended (its parent, init, reaps it)
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_benchmark_takes_its_servers_with_it():
    bench = subprocess.Popen([sys.executable, "-c", BENCH], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    pids: list[int] = []
    try:
        lines = []
        for line in bench.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("PIDS "):
                _, moto, sleeper, endpoint = line.split()
                pids = [int(moto), int(sleeper)]
                break
        assert pids, "the benchmark did not start its children:\n" + "".join(lines)
        assert endpoint.startswith("http://127.0.0.1:") and int(endpoint.rsplit(":", 1)[1]) > 0
        assert all(_alive(p) for p in pids)
        bench.send_signal(signal.SIGKILL)
        bench.wait(30)
        deadline = time.monotonic() + 60
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if _alive(p)], "children outlived the killed benchmark"
    finally:
        for p in pids:
            if _alive(p):
                os.killpg(p, signal.SIGKILL)
        if bench.poll() is None:
            bench.kill()
