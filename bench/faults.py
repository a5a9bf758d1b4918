"""``objectcache bench faults``: a bounded load and fault run, every byte checked.

Four scenarios, each against a fresh ``objectcache serve`` on 127.0.0.1:

* **mixed load**: concurrent clients mixing plain PUT/GET and KV put/fetch over
  ``http`` and ``shm``, every object and payload compared with what was sent;
* **storage server killed mid-transfer**: a paced kv-get is running when the daemon
  is SIGKILLed; the client must get a clear error, and the time until KV service
  answers again is measured, kill after kill (the restart back-off must not grow);
* **whole tree killed mid-PUT**: the process group is SIGKILLed during concurrent
  PUT streams and restarted on the same data: every acknowledged PUT must read back
  intact and no torn object may be visible;
* **disk full**: the store on a small tmpfs (root only; skipped otherwise) is filled
  until PUTs answer 507, and must hold exactly what was acknowledged.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from client_sdk import KVLayout, ObjectCacheClient, ObjectCacheError, chunk_keys

from .harness import add_bench_parser, finish, print_table, s3_client, start_server


async def _storage_server_pid(server_root: Path) -> int:
    """The daemon's pid, from its status on the RPC socket (the operator's view)."""
    reader, writer = await asyncio.open_unix_connection(str(server_root / "data" / "storage-server.sock"))
    writer.write(b'{"op": "status"}\n')
    line = await reader.readline()
    writer.close()
    return int(json.loads(line)["pid"])


async def mixed_load(quick: bool) -> dict:
    server = start_server()
    layout = KVLayout(num_layers=8, chunk_tokens=16, kv_heads=2, head_dim=32, dtype="bfloat16")
    clients, rounds = (4, 3) if quick else (16, 10)
    checked = {"objects": 0, "kv_fetches": 0, "bytes": 0, "mismatches": 0, "errors": 0}
    started = time.perf_counter()
    try:
        async with s3_client(server.endpoint, server.access_key, server.secret_key, connections=clients) as s3:
            await s3.create_bucket(Bucket="faults-mixed")

            async def one(c: int) -> None:
                rng = np.random.default_rng(c)
                async with ObjectCacheClient(server.endpoint, server.access_key, server.secret_key, bucket="faults-mixed") as kv:
                    for r in range(rounds):
                        try:
                            data = rng.integers(0, 256, int(rng.integers(4096, 1 << 20)), dtype=np.uint8).tobytes()
                            key = f"obj/{c}/{r}"
                            await s3.put_object(Bucket="faults-mixed", Key=key, Body=data)
                            got = await (await s3.get_object(Bucket="faults-mixed", Key=key))["Body"].read()
                            checked["objects"] += 1
                            checked["bytes"] += len(got)
                            checked["mismatches"] += got != data
                            n = int(rng.integers(1, 64))
                            keys = chunk_keys(rng.integers(0, 50000, n * layout.chunk_tokens), layout.chunk_tokens, f"mixed-{c}-{r}")
                            chunks = list(rng.integers(0, 256, (n, layout.chunk_bytes), dtype=np.uint8))
                            await kv.put_chunks(keys, chunks, layout)
                            payload, _ = await kv.fetch(keys, layout, "shm" if (c + r) % 2 else "http")
                            expected = np.stack(chunks).reshape(n, layout.num_layers, -1).transpose(1, 0, 2).reshape(layout.num_layers, -1)
                            checked["kv_fetches"] += 1
                            checked["bytes"] += payload.nbytes
                            checked["mismatches"] += not np.array_equal(payload, expected)
                        except ObjectCacheError:
                            checked["errors"] += 1

            await asyncio.gather(*(one(c) for c in range(clients)))
    finally:
        server.stop()
    return {**checked, "clients": clients, "seconds": round(time.perf_counter() - started, 2)}


async def storage_server_kills(quick: bool) -> dict:
    # Paced at ~4 layers/s so a transfer is always in flight when the daemon dies.
    layout = KVLayout(num_layers=32, chunk_tokens=16, kv_heads=1, head_dim=8, dtype="uint8")
    n = 64
    gbps = layout.per_layer_chunk_bytes * n * 4 * 8 / 1e9
    server = start_server(f'\n[bandwidth]\ncapacity_gbps = {gbps!r}\npolicy = "equal"\n')
    kills, recoveries, errors = (3 if quick else 6), [], []
    try:
        async with ObjectCacheClient(server.endpoint, server.access_key, server.secret_key, bucket="faults-kill") as c:
            await c.ensure_bucket()
            keys = chunk_keys(np.arange(n * layout.chunk_tokens), layout.chunk_tokens, "kill")
            await c.put_chunks(keys, list(np.zeros((n, layout.chunk_bytes), np.uint8)), layout)
            for _ in range(kills):
                pid = await _storage_server_pid(server.root)
                killed = time.perf_counter()
                try:
                    async with c.fetch_layers(keys, layout, "http", mode="layerwise") as layers:
                        async for idx, _ in layers:
                            if idx == 0:
                                os.kill(pid, signal.SIGKILL)
                                killed = time.perf_counter()
                    errors.append("none (finished)")
                except ObjectCacheError as e:
                    errors.append(e.code.name)
                deadline = time.perf_counter() + 60
                while time.perf_counter() < deadline:
                    try:
                        await c.lookup(keys[:1])
                        break
                    except ObjectCacheError:
                        await asyncio.sleep(0.05)
                recoveries.append(round(time.perf_counter() - killed, 2))
                await asyncio.sleep(0.5 if quick else 4)  # --quick: a crash loop (back-off grows); else healthy between kills
    finally:
        server.stop()
    return {"kills": kills, "client_errors": errors, "recovery_s": recoveries, "max_recovery_s": max(recoveries)}


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


async def tree_killed_mid_put(quick: bool) -> dict:
    server = start_server()
    streams, size = (4, 4 << 20) if quick else (16, 16 << 20)
    acknowledged: dict[str, str] = {}
    try:
        async with s3_client(server.endpoint, server.access_key, server.secret_key, connections=streams) as s3:
            await s3.create_bucket(Bucket="faults-crash")

            async def writer(i: int) -> None:
                for r in range(1000):
                    data = os.urandom(size if r % 2 else 64 << 10)
                    key = f"w{i}/{r}"
                    try:
                        await s3.put_object(Bucket="faults-crash", Key=key, Body=data)
                    except Exception:
                        return
                    acknowledged[key] = _md5(data)

            tasks = [asyncio.ensure_future(writer(i)) for i in range(streams)]
            await asyncio.sleep(1.5 if quick else 4)
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait(10)
            await asyncio.gather(*tasks, return_exceptions=True)
        server = server.restart()
        intact = torn = 0
        async with s3_client(server.endpoint, server.access_key, server.secret_key) as s3:
            pages = s3.get_paginator("list_objects_v2").paginate(Bucket="faults-crash")
            visible = [o["Key"] async for page in pages for o in page.get("Contents", [])]
            for key in visible:
                data = await (await s3.get_object(Bucket="faults-crash", Key=key))["Body"].read()
                if key in acknowledged:
                    intact += _md5(data) == acknowledged[key]
                elif len(data) not in (size, 64 << 10):
                    torn += 1
        lost = sum(1 for k in acknowledged if k not in visible)
    finally:
        server.stop()
    return {"acknowledged": len(acknowledged), "intact": intact, "lost": lost, "torn_visible": torn}


async def disk_full(quick: bool) -> dict:
    if os.geteuid() != 0:
        return {"skipped": "needs root to mount a small tmpfs"}
    mount = Path(tempfile.mkdtemp(prefix="objectcache-full-"))
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True).returncode != 0:
        return {"skipped": "cannot mount a tmpfs here"}
    statuses: dict[int, int] = {}
    acknowledged: dict[str, str] = {}
    server = start_server(root=mount)
    try:
        async with s3_client(server.endpoint, server.access_key, server.secret_key) as s3:
            await s3.create_bucket(Bucket="faults-full")
            for i in range(64):
                data = os.urandom(1 << 20)
                try:
                    await s3.put_object(Bucket="faults-full", Key=f"k{i}", Body=data)
                    statuses[200] = statuses.get(200, 0) + 1
                    acknowledged[f"k{i}"] = _md5(data)
                except Exception as e:
                    code = getattr(e, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
                    statuses[code] = statuses.get(code, 0) + 1
            pages = s3.get_paginator("list_objects_v2").paginate(Bucket="faults-full")
            visible = {o["Key"] async for page in pages for o in page.get("Contents", [])}
            intact = 0
            for key in visible & set(acknowledged):
                intact += _md5(await (await s3.get_object(Bucket="faults-full", Key=key))["Body"].read()) == acknowledged[key]
    finally:
        server.stop(keep_data=True)
        subprocess.run(["umount", "-l", str(mount)], check=False)
        mount.rmdir()
    return {"statuses": statuses, "acknowledged": len(acknowledged), "visible": len(visible), "intact": intact,
            "consistent": visible == set(acknowledged) and intact == len(acknowledged)}


def run(args: argparse.Namespace) -> dict:
    async def all_scenarios() -> dict:
        return {"mixed_load": await mixed_load(args.quick), "storage_server_kills": await storage_server_kills(args.quick),
                "tree_killed_mid_put": await tree_killed_mid_put(args.quick), "disk_full": await disk_full(args.quick)}

    r = asyncio.run(all_scenarios())
    m, k, t, d = r["mixed_load"], r["storage_server_kills"], r["tree_killed_mid_put"], r["disk_full"]
    print_table(["scenario", "result"], [
        ["mixed load", f"{m['clients']} clients, {m['objects']} objects + {m['kv_fetches']} KV fetches, {m['bytes'] >> 20} MiB checked, "
                       f"{m['mismatches']} mismatches, {m['errors']} errors, {m['seconds']} s"],
        ["storage server killed mid-transfer", f"{k['kills']} kills; client saw {', '.join(sorted(set(k['client_errors'])))}; "
                                               f"KV back after {k['recovery_s']} s (max {k['max_recovery_s']} s)"],
        ["whole tree killed mid-PUT", f"{t['acknowledged']} acknowledged, {t['intact']} intact, {t['lost']} lost, {t['torn_visible']} torn visible"],
        ["disk full", d.get("skipped") or f"statuses {d['statuses']}; {d['acknowledged']} acknowledged, {d['visible']} visible, "
                                         f"{d['intact']} intact, consistent: {d['consistent']}"],
    ])
    result = {"benchmark": "faults", "quick": args.quick, **r}
    return finish(args, result)


def add_parser(sub) -> None:
    add_bench_parser(sub, "faults", "bounded load and fault run: mixed load, daemon kills, crash mid-PUT, disk full", run)
