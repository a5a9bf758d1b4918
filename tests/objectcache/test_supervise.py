"""`objectcache serve` keeps both processes up: a crashed gateway is restarted on its port while the
storage server (its chunks, its registered regions) runs on untouched. Before, a gateway crash stopped
the storage server too and `serve` exited."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
from kvsupport import client, keys_for, make_chunks, reference, rpc, run, tiny_layout
from support import ServerProcess, boto_client, make_tenants, write_config


def child_pid(parent: int, role: str) -> int:
    """The pid of ``parent``'s child running ``objectcache <role>``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and role.encode() in argv:
            return int(entry.name)
    raise AssertionError(f"no {role} child of {parent}")


def wait_for(predicate, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_crashed_gateway_is_restarted_on_its_port_and_the_storage_server_runs_on(tmp_path):
    tenant = make_tenants("t")[0]
    sock = tmp_path / "ss.sock"
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra=f'\n[storage_server]\nsocket = "{sock}"\n')
    proc = ServerProcess(config).start()
    layout = tiny_layout(16, num_layers=4)
    keys, chunks = keys_for(layout, 8, "sup"), make_chunks(layout, 8, seed=9)
    try:
        s3 = boto_client(proc.endpoint, tenant)
        s3.create_bucket(Bucket="sup")

        async def put_and_fetch() -> None:
            async with client(proc, tenant, "sup") as c:
                await c.put_chunks(keys, chunks, layout)
                payload, _ = await c.fetch(keys, layout, "shm")
                assert np.array_equal(payload, reference(layout, chunks))

        run(put_and_fetch())
        storage_pid = rpc(str(sock), "status")["pid"]
        for crash in range(2):  # twice: the restarted gateway is supervised as well
            gateway_pid = child_pid(proc.proc.pid, "gateway")
            os.kill(gateway_pid, signal.SIGKILL)
            wait_for(lambda: sum("gateway is back" in line for line in proc.output) > crash, f"gateway restart {crash + 1}:\n"
                     + "".join(proc.output[-20:]))
            assert proc.proc.poll() is None and child_pid(proc.proc.pid, "gateway") != gateway_pid
            assert rpc(str(sock), "status")["pid"] == storage_pid  # the storage server was never stopped
            assert s3.head_bucket(Bucket="sup")["ResponseMetadata"]["HTTPStatusCode"] == 200  # the same endpoint

        async def fetch_again() -> None:
            async with client(proc, tenant, "sup") as c:
                assert await c.lookup(keys) == 8
                payload, _ = await c.fetch(keys, layout, "http")
                assert np.array_equal(payload, reference(layout, chunks))

        run(fetch_again())
    finally:
        assert proc.stop() == 0


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_a_killed_serve_takes_both_processes_with_it(tmp_path):
    """SIGKILL (an OOM kill, a ``kill -9``) runs no handler in ``serve``: the kernel ends its children instead of
    leaving them holding the port and the data directory's lock."""
    config = write_config(tmp_path / "c.toml", tmp_path / "data", make_tenants("t"))
    proc = ServerProcess(config).start()
    children = [child_pid(proc.proc.pid, "gateway"), child_pid(proc.proc.pid, "storage-server")]
    try:
        proc.proc.kill()
        proc.proc.wait(30)
        wait_for(lambda: not any(_alive(p) for p in children), "serve's children outlived it", timeout_s=60)
        again = ServerProcess(config).start()  # the data directory is free again
        assert again.stop() == 0
    finally:
        for p in children:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
