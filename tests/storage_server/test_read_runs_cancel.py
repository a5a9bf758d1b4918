"""A transfer cancelled mid-piece (the client left) returns only once no read thread still writes into the piece's buffer:
the transport frees that buffer as the cancellation unwinds (a BufferError at teardown showed a thread still held it)."""

from __future__ import annotations

import asyncio
import os
import threading

import numpy as np

from protocol.wire import Descriptor, Mode, Target, TransportKind
from storage_server import executor as executor_module
from storage_server.executor import Executor, ReadPlan

L, N, S = 2, 4, 4096  # layers, chunks, bytes of one layer of one chunk


def test_a_cancelled_piece_returns_only_once_no_read_thread_writes(tmp_path, monkeypatch):
    fds = []
    for j in range(N):
        path = tmp_path / f"c{j}"
        path.write_bytes(np.full(L * S, j, np.uint8).tobytes())
        fds.append(os.open(path, os.O_RDONLY))
    release, entered, running = threading.Event(), threading.Event(), []
    real_read_run = executor_module._read_run

    def slow_read_run(*args):
        running.append(1)
        entered.set()
        release.wait(30)
        try:
            return real_read_run(*args)
        finally:
            running.pop()

    monkeypatch.setattr(executor_module, "_read_run", slow_read_run)
    d = Descriptor([f"k{j}" for j in range(N)], L, 16, S, Target(TransportKind.SHM), mode=Mode.LAYERWISE)
    plan = ReadPlan(d, Mode.LAYERWISE, fds, [0] * N, N)
    assert not plan.mapped

    async def scenario(executor: Executor) -> tuple[list[int], bytes]:
        dest = memoryview(bytearray(N * S))
        task = asyncio.ensure_future(executor.read_piece(plan, 1, 0, N, dest))
        assert await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
        task.cancel()
        threading.Timer(0.3, release.set).start()  # the reads finish a moment after the cancel
        try:
            await task
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("the cancelled piece completed")
        return list(running), bytes(dest)

    executor = Executor(2)
    try:
        still_running, got = asyncio.run(scenario(executor))
    finally:
        release.set()
        executor.close()
        for fd in fds:
            os.close(fd)
    assert still_running == [], "the cancelled piece returned while read threads still wrote into its buffer"
    # Each run's thread finished its read (into the buffer the piece still owned): byte-exact chunks, none torn.
    assert got == b"".join(bytes([j]) * S for j in range(N))
