"""How long the first shm fetch of a process takes against the ones after it, with and without ``warm_up``.

    python -m bench.first_fetch [--chunks 64] [--model llama-3.1-8b] [--runs 3]

Starts ``objectcache serve`` on a free port in a temporary directory, stores the chunks,
then, in fresh clients, times fetches 1..runs over shm: once cold, once after
``await client.warm_up(payload_bytes)`` (itself timed). Prints one line per case.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from client_sdk import KVLayout, ObjectCacheClient, chunk_keys
from objectcache.lifeline import spawn

REPO = Path(__file__).resolve().parent.parent


def _serve(root: Path) -> tuple[subprocess.Popen, str, str, str]:
    ak, sk = "AKFIRSTFETCH", "first-fetch-secret-0123456789"
    cfg = root / "c.toml"
    cfg.write_text(f'[store]\ndata_dir = "{root / "data"}"\n\n[[tenants]]\nname = "b"\naccess_key = "{ak}"\nsecret_key = "{sk}"\n')
    proc = spawn([sys.executable, "-m", "objectcache", "serve", "--config", str(cfg), "--port", "0"], stdout=subprocess.PIPE,
                 text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    endpoint = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        if "endpoint:" in line:
            endpoint = line.split("endpoint:", 1)[1].strip()
        if line.startswith("Press Ctrl-C"):
            return proc, endpoint, ak, sk
    raise SystemExit("objectcache serve did not start")


async def _case(endpoint: str, ak: str, sk: str, keys: list[str], layout: KVLayout, runs: int, warm: bool) -> tuple[float, list[float]]:
    async with ObjectCacheClient(endpoint, ak, sk, bucket="first-fetch") as c:
        await c.lookup(keys)  # the connection is open in both cases: only the shm path differs
        t0 = time.perf_counter()
        if warm:
            await c.warm_up(layout.payload_bytes(len(keys)))
        warm_s = time.perf_counter() - t0
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            await c.fetch(keys, layout, "shm")
            times.append(time.perf_counter() - t0)
        return warm_s, times


async def _main(args: argparse.Namespace) -> None:
    layout = KVLayout.preset(args.model, chunk_tokens=16)
    keys = chunk_keys(np.arange(args.chunks * 16) % 50000, 16, "first-fetch")
    with tempfile.TemporaryDirectory() as tmp:
        proc, endpoint, ak, sk = _serve(Path(tmp))
        try:
            async with ObjectCacheClient(endpoint, ak, sk, bucket="first-fetch") as c:
                await c.ensure_bucket()
                rng = np.random.default_rng(0)
                await c.put_chunks(keys, [rng.integers(0, 256, layout.chunk_bytes, dtype=np.uint8) for _ in keys], layout)
            print(f"{args.chunks} chunks of {args.model}: payload {layout.payload_bytes(len(keys)) / 2**20:.0f} MiB over shm")
            for rep in range(args.repeat):
                for warm in (False, True):
                    if not hasattr(ObjectCacheClient, "warm_up") and warm:
                        continue
                    warm_s, times = await _case(endpoint, ak, sk, keys, layout, args.runs, warm)
                    ms = ", ".join(f"{t * 1000:.1f}" for t in times)
                    label = f"warm_up {warm_s * 1000:.1f} ms, then" if warm else "cold:"
                    print(f"  [{rep}] {label} fetches {ms} ms (first/last {times[0] / times[-1]:.1f}x)")
        finally:
            proc.terminate()
            proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chunks", type=int, default=64)
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--repeat", type=int, default=3)
    asyncio.run(_main(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
