"""The storage-server daemon: owns the store, executes KV descriptors, answers the gateway's RPC.

RPC (Unix socket by default, TCP configurable): each request is one JSON line,
optionally followed by ``body`` raw bytes (a descriptor). Replies are one JSON
line; ``kv-get`` then streams wire frames (``storage_server.wire``) until the
END or ERROR frame and closes the connection, so the gateway can relay the
bytes without parsing them.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import resource
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .backend import Backend, LocalDiskBackend
from .config import Config
from .errors import ErrorCode, S3Error
from scheduler.policies import TransferDemand

from .bandwidth import GBPS, BandwidthPool
from .executor import ChunkPlan, Executor, Pacer, choose_mode, open_chunks
from .open_files import OpenFileCache
from .regions import RegionRegistry
from .staging import StagingBudget
from .transports import FrameSink, HttpTransport, ShmTransport, Transport
from .transports.rdma import open_rdma_transport
from .wire import Descriptor, Mode, TransferStats, Transport as TransportKind, decode_descriptor

log = logging.getLogger("objectcache.storage_server")

MAX_REQUEST_LINE = 1 << 20
MAX_BODY = 64 << 20

Reply = dict[str, Any] | None  # None: the handler streamed its own response


@dataclass
class RpcCall:
    """One RPC request: its JSON fields, its raw body, and the connection (for streaming replies)."""

    request: dict[str, Any]
    body: bytes
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


RpcHandler = Callable[["StorageServer", RpcCall], Awaitable[Reply]]


def open_backend(config: Config) -> Backend:
    """The store both processes open (the daemon owns it; the gateway serves plain S3 through it)."""
    return LocalDiskBackend(config.data_dir, io_threads=config.store.io_threads)


class TestGate:
    """Test hook (``storage_server.test_hooks = true`` only): hold the next transfer before a layer.

    Lets a test show with events, not timing, that layer 0 reaches the client
    while later layers are not yet written.
    """

    def __init__(self) -> None:
        self.before_layer: int | None = None
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def check(self, layer: int) -> None:
        if self.before_layer is not None and layer == self.before_layer:
            self.before_layer = None
            self.held.set()
            await self.release.wait()


class StorageServer:
    def __init__(self, config: Config, backend: Backend) -> None:
        self.config = config
        self.backend = backend
        self.started = time.time()
        ss = config.storage_server
        self.executor = Executor(ss.io_threads or os.cpu_count() or 2, ss.theta_bytes)
        self.regions = RegionRegistry()
        self.staging = StagingBudget(ss.http_staging_bytes)
        self.open_files = OpenFileCache(min(ss.open_files, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2))
        self._housekeeper: asyncio.Task | None = None
        self.gate = TestGate() if ss.test_hooks else None
        bw = config.bandwidth
        self.pool = BandwidthPool(
            bw,
            tenant_caps={t.name: t.bandwidth_cap_gbps * GBPS for t in config.tenants if t.bandwidth_cap_gbps > 0},
            tenant_weights={t.name: t.weight for t in config.tenants if t.weight != 1.0},
        ) if bw.enabled else None
        self.active: dict[str, dict[str, Any]] = {}
        self.completed = 0
        self.bytes_delivered = 0
        self.handlers: dict[str, RpcHandler] = {
            "ping": _ping,
            "status": _status,
            "kv-get": _kv_get,
            "kv-register": _kv_register,
            "kv-unregister": _kv_unregister,
        }
        if self.gate is not None:
            self.handlers["test-hold"] = _test_hold
            self.handlers["test-wait-held"] = _test_wait_held
            self.handlers["test-release"] = _test_release

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                body = b""
                try:
                    request = json.loads(line)
                    if not isinstance(request, dict):
                        raise ValueError("request must be a JSON object")
                    n = int(request.get("body", 0))
                    if not 0 <= n <= MAX_BODY:
                        raise ValueError(f"body of {n} bytes is out of range")
                    body = await reader.readexactly(n) if n else b""
                    handler = self.handlers.get(request.get("op"))
                    if handler is None:
                        raise S3Error(ErrorCode.InvalidRequest, f"unknown storage-server op {request.get('op')!r}")
                    reply = await handler(self, RpcCall(request, body, reader, writer))
                    if reply is None:
                        break  # streamed; one streaming request per connection
                    reply = {"ok": True, **reply}
                except S3Error as e:
                    reply = {"ok": False, "error": e.to_dict()}
                except (ValueError, TypeError, AttributeError) as e:
                    reply = {"ok": False, "error": S3Error(ErrorCode.InvalidRequest, f"bad RPC request: {e}").to_dict()}
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (ConnectionResetError, BrokenPipeError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def start(self) -> asyncio.AbstractServer:
        self._housekeeper = asyncio.ensure_future(self.housekeeping())
        if self.config.storage_server.tcp:
            host, _, port = self.config.storage_server.tcp.rpartition(":")
            return await asyncio.start_server(self._serve_connection, host, int(port), limit=MAX_REQUEST_LINE)
        path = self.config.rpc_socket
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            path.unlink()
        server = await asyncio.start_unix_server(self._serve_connection, str(path), limit=MAX_REQUEST_LINE)
        os.chmod(path, 0o600)
        return server

    async def housekeeping(self) -> None:
        """Free what nobody will release: files left by a crash (once), then periodically
        fds of deleted objects and regions of vanished clients."""
        ss = self.config.storage_server
        try:
            orphans = await self.backend.reclaim_orphans()
            if orphans:
                log.warning("housekeeping: removed %d unreferenced object files left by an earlier crash", orphans)
        except Exception:
            log.exception("housekeeping: reclaiming crash leftovers failed (will retry at the next start)")
        while True:
            await asyncio.sleep(ss.housekeeping_s)
            try:
                closed = await asyncio.get_running_loop().run_in_executor(self.executor.pool, self.open_files.sweep)
                expired = self.regions.expire(ss.region_idle_s)
            except Exception:  # one bad round must not end housekeeping for the daemon's lifetime
                log.exception("housekeeping round failed")
                continue
            if closed or expired:
                log.info("housekeeping: closed %d cached fds of deleted objects, dropped %d idle regions", closed, expired)

    def close(self) -> None:
        if self._housekeeper is not None:
            self._housekeeper.cancel()
        self.executor.close()
        self.regions.close()
        self.open_files.close()


async def _ping(server: StorageServer, call: RpcCall) -> Reply:
    return {"pong": True}


async def _status(server: StorageServer, call: RpcCall) -> Reply:
    return {
        "uptime_s": time.time() - server.started,
        "data_dir": str(server.config.data_dir),
        "pid": os.getpid(),
        "regions": len(server.regions),
        "transfers_active": list(server.active.values()),
        "transfers_completed": server.completed,
        "bytes_delivered": server.bytes_delivered,
        "open_fds": len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else -1,
        "open_file_cache": server.open_files.status(),
        "http_staging": server.staging.status(),
        "bandwidth": server.pool.status() if server.pool is not None else {"enabled": False},
    }


def _transport(server: StorageServer, tenant: str, d: Descriptor, frames: FrameSink) -> Transport:
    t = d.target
    if t.transport == TransportKind.SHM:
        region = server.regions.resolve(tenant, t.region_id, t.token, t.offset, d.payload_bytes)
        return ShmTransport(frames, region, t.offset, d.layer_bytes, d.num_layers)
    if t.transport == TransportKind.HTTP:
        return HttpTransport(frames, t.offset, d.layer_bytes, d.num_layers)
    return open_rdma_transport(d)


async def _kv_get(server: StorageServer, call: RpcCall) -> Reply:
    request, writer = call.request, call.writer
    tenant, bucket, request_id = str(request["tenant"]), str(request["bucket"]), str(request.get("request_id", ""))
    d = decode_descriptor(call.body, server.config.storage_server.max_keys)
    mode = choose_mode(d, server.executor.theta_bytes)
    frames = FrameSink(writer)
    transport = _transport(server, tenant, d, frames)
    if mode == Mode.CHUNKWISE and transport.staging_bytes(chunkwise=True) > server.staging.total:
        mode = Mode.LAYERWISE  # same bytes, bounded staging; the END report names the mode used
    plan = None
    try:
        locations = await server.backend.locate(bucket, d.chunk_keys)
        fds = await asyncio.get_running_loop().run_in_executor(server.executor.pool, open_chunks, locations, d, server.open_files)
        plan = ChunkPlan(d, fds, mode, [loc[0] for loc in locations], server.open_files)  # type: ignore[index]
        # Validation passed: nothing can fail for the client's input from here on.
        writer.write(json.dumps({"ok": True, "mode": mode.name.lower(), "payload_bytes": d.payload_bytes, "num_layers": d.num_layers}).encode() + b"\n")
        server.active[request_id] = {"request_id": request_id, "tenant": tenant, "mode": mode.name.lower(), "payload_bytes": d.payload_bytes}
        try:
            run = functools.partial(_paced_run, server, plan, transport, tenant, request_id)
            stats = await _until_disconnect(call.reader, _staged(server, transport.staging_bytes(mode == Mode.CHUNKWISE), run))
            stats.request_id = request_id
            await frames.end(stats.to_json())
            server.completed += 1
            server.bytes_delivered += d.payload_bytes
        except S3Error as e:
            await frames.error(e.to_dict())
        except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
            log.info("client of %s went away; transfer stopped", request_id)
        except Exception as e:
            log.exception("transfer %s failed", request_id)
            await frames.error(S3Error(ErrorCode.InternalError, f"transfer failed: {e.__class__.__name__}").to_dict())
        return None
    finally:
        server.active.pop(request_id, None)
        if plan is not None:
            plan.close()
        transport.close()


async def _staged(server: StorageServer, nbytes: int, run: Callable[[], Awaitable[TransferStats]]) -> TransferStats:
    """Start ``run()`` once its staging memory fits the server's budget (http); waiting ends if the client leaves."""
    async with server.staging.hold(nbytes):
        return await run()


async def _paced_run(server: StorageServer, plan: ChunkPlan, transport: Transport, tenant: str, request_id: str) -> TransferStats:
    """Layerwise transfers join the bandwidth pool (when configured); chunkwise ones bypass it."""
    pacers: list[Pacer] = [GatePacer(server.gate)] if server.gate is not None else []
    lease = None
    if server.pool is not None and plan.mode == Mode.LAYERWISE:
        d = plan.descriptor
        window = d.compute_window
        compute = sum(window) / len(window) if window else server.config.bandwidth.default_compute_per_layer_s
        lease = await server.pool.join(request_id, tenant, TransferDemand(d.layer_bytes, compute, d.num_layers))
        pacers.append(lease)
    try:
        stats = await server.executor.run(plan, transport, Pacers(*pacers) if pacers else None)
        if lease is not None:
            stats.allocation = lease.describe()
        return stats
    finally:
        if lease is not None:
            server.pool.leave(lease)


async def _until_disconnect(reader: asyncio.StreamReader, work: Awaitable[TransferStats]) -> TransferStats:
    """Run ``work`` but stop it as soon as the peer closes the connection (even while paused)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(reader.read(1))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise ConnectionAbortedError("the gateway closed the stream")
        return task.result()
    finally:
        watcher.cancel()


class GatePacer:
    """Counts layers for the test gate."""

    def __init__(self, gate: TestGate) -> None:
        self.gate, self.layer = gate, 0

    async def before_layer(self, nbytes: int) -> None:
        await self.gate.check(self.layer)
        self.layer += 1

    def after_layer(self) -> None:
        pass


class Pacers:
    """Several pacers in order (test gate, then the bandwidth lease)."""

    def __init__(self, *pacers: Pacer) -> None:
        self.pacers = pacers

    async def before_layer(self, nbytes: int) -> None:
        for p in self.pacers:
            await p.before_layer(nbytes)

    def after_layer(self) -> None:
        for p in self.pacers:
            p.after_layer()


async def _kv_register(server: StorageServer, call: RpcCall) -> Reply:
    r = call.request
    region = server.regions.register(str(r["tenant"]), str(r["name"]), int(r["size"]), bytes.fromhex(str(r["nonce"])))
    return {"region_id": region.region_id.hex(), "token": region.token.hex(), "size": region.size}


async def _kv_unregister(server: StorageServer, call: RpcCall) -> Reply:
    r = call.request
    server.regions.unregister(str(r["tenant"]), bytes.fromhex(str(r["region_id"])), bytes.fromhex(str(r["token"])))
    return {}


async def _test_hold(server: StorageServer, call: RpcCall) -> Reply:
    assert server.gate is not None
    server.gate.before_layer = int(call.request["before_layer"])
    server.gate.held.clear()
    server.gate.release.clear()
    return {}


async def _test_wait_held(server: StorageServer, call: RpcCall) -> Reply:
    assert server.gate is not None
    try:
        await asyncio.wait_for(server.gate.held.wait(), float(call.request.get("timeout", 30)))
    except asyncio.TimeoutError:
        return {"held": False}
    return {"held": True}


async def _test_release(server: StorageServer, call: RpcCall) -> Reply:
    assert server.gate is not None
    held = server.gate.held.is_set()
    server.gate.release.set()
    return {"was_held": held}
