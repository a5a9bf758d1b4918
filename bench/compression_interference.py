"""Interference on CPU (ShadowServe §2.2's point): does decoding slow the engine's compute when it runs in the
engine's own process, and when it runs in another process (the node)?

An "engine" process runs a compute loop for a fixed time — float32 matmuls with a little Python between
them, as a serving loop dispatches kernels — and counts iterations. Three runs: alone; with ``workers``
decode threads inside the engine's process; with the same decode threads in a separate "node" process.
Both sides report their rate, so the slowdown is seen both ways (compute iterations/s and decode GB/s).
BLAS is held to one thread in both processes so the loop is one core's work, like one engine thread.

``pinned``: the engine's process runs on half the cores and the node's on the other half (as cpusets would
give each its own), so decoding in the engine's process competes for the engine's cores and GIL, and in the
node's for neither. Unpinned, both float over every core: on a machine with few cores the node's decoders
then compete for the same cores, which is the case ShadowServe avoids with separate hardware.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from dataclasses import dataclass

import numpy as np

ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass
class InterferenceRun:
    mode: str  # "alone", "decode in engine process", "decode in node process"
    compute_iters_per_s: float
    decode_gb_s: float
    pinned: bool


def core_split() -> tuple[set[int], set[int]] | None:
    """(engine cores, node cores): the first half and the rest; None with fewer than two cores."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    half = len(cores) // 2
    return set(cores[:half]), set(cores[half:])


def _pin(cores: set[int] | None) -> None:
    if cores:
        os.sched_setaffinity(0, cores)


def _decode_loop(codec_name: str, blobs: list[bytes], slice_bytes: int, layout, go, stop, out_q, workers: int) -> None:
    """``workers`` threads decoding ``blobs`` round and round until ``stop``; puts raw GB/s decoded."""
    from protocol.codecs import BATCH_BYTES, CODEC_NAMES

    codec = CODEC_NAMES[codec_name]
    done = [0] * workers
    per = max(1, BATCH_BYTES // slice_bytes)  # slices per call, as the SDK's and the node's decoders batch them

    def worker(w: int) -> None:
        dest = np.empty(per * slice_bytes, np.uint8)
        i = w * per
        while not stop.is_set():
            codec.decode_many([blobs[(i + k) % len(blobs)] for k in range(per)], dest, "bfloat16", layout)
            done[w] += per * slice_bytes
            i += workers * per

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(workers)]
    out_q.put(("ready", 0.0))
    go.wait()
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out_q.put(("decode", sum(done) / (time.perf_counter() - start) / 1e9))


def _engine(seconds: float, decode_args: tuple | None, go, stop, out_q, cores: set[int] | None = None) -> None:
    """The compute loop; with ``decode_args`` the decode threads run in this same process."""
    _pin(cores)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((192, 192), np.float32)
    w = rng.standard_normal((192, 192), np.float32) / 14.0
    decoder = None
    if decode_args is not None:
        decoder = threading.Thread(target=_decode_loop, args=(*decode_args[:-1], go, stop, out_q, decode_args[-1]), daemon=True)
        decoder.start()
    out_q.put(("ready", 0.0))
    go.wait()
    iters, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a = np.tanh(a @ w)  # one "kernel" and the Python around it
        iters += 1
    elapsed = time.perf_counter() - start
    stop.set()
    if decoder is not None:
        decoder.join()  # its report must leave before this process exits
    out_q.put(("compute", iters / elapsed))


def _decode_only(codec_name, blobs, slice_bytes, layout, workers, go, stop, out_q, cores: set[int] | None = None) -> None:
    _pin(cores)
    _decode_loop(codec_name, blobs, slice_bytes, layout, go, stop, out_q, workers)


def measure(codec_name: str, blobs: list[bytes], slice_bytes: int, layout, workers: int, seconds: float,
            pinned: bool) -> list[InterferenceRun]:
    """The three runs; ``pinned`` is honoured only where there are two cores or more (see the module docstring)."""
    split = core_split() if pinned else None
    engine_cores, node_cores = split or (None, None)
    ctx = mp.get_context("spawn")
    saved = {k: os.environ.get(k) for k in ONE_THREAD}
    os.environ.update(ONE_THREAD)  # inherited by the spawned processes
    try:
        runs = []
        for mode in ("alone", "decode in engine process", "decode in node process"):
            go, stop, out_q = ctx.Event(), ctx.Event(), ctx.Queue()
            decode_args = (codec_name, blobs, slice_bytes, layout, workers)
            procs = [ctx.Process(target=_engine, args=(seconds, decode_args if mode == "decode in engine process" else None, go, stop, out_q,
                                                       engine_cores))]
            if mode == "decode in node process":
                procs.append(ctx.Process(target=_decode_only, args=(*decode_args, go, stop, out_q, node_cores)))
            for p in procs:
                p.start()
            parties = 1 if mode == "alone" else 2
            for _ in range(parties):  # both sides imported and built their inputs before the clock starts
                if out_q.get(timeout=120)[0] != "ready":
                    raise RuntimeError("interference: a side reported before it was ready")
            go.set()
            got = dict(out_q.get(timeout=seconds + 120) for _ in range(parties))
            for p in procs:
                p.join(60)
            runs.append(InterferenceRun(mode, got["compute"], got.get("decode", 0.0), split is not None))
        return runs
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
