"""The KV operations of the storage server: put, lookup, and the kv-get orchestration (registrations: :mod:`.registrations`).

A kv-get: decode the descriptor, open its transport (checking the client's
capability), pin its chunks, plan the transfer (:mod:`.plan`), accept, then run
the executor under the http staging budget and the pacers (the bandwidth
pool's lease, and whatever the server was built with), stopping as soon as the
client goes away. Chunks are unpinned and the transport closed on every path.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from protocol.compressed_chunk import MAGIC as COMPRESSED_MAGIC
from protocol.compressed_chunk import ChunkShape
from protocol.config import Config
from protocol.errors import ErrorCode, S3Error
from protocol.kv_http import LoadBudget, LookupReply, PutReply
from protocol.rpc import KVGetAccepted, encode_reply
from protocol.wire import Descriptor, TransferStats, decode_descriptor, decode_keys, decode_put_batch
from scheduler.policies import TransferDemand

from .bandwidth import GBPS, BandwidthPool, Lease
from .compressed_reads import ChunkHeader, check_puts, encode_puts, read_headers
from .deadline import LoadDeadline, lookup_deliverable
from .decode_choice import decode_site
from .decoded_copies import DecodedCopies, prefill_after_put
from .executor import Executor, ReadPlan
from .fd_budget import FDS_PER_FILE, FdBudget
from .memory_budget import MemoryBudget
from .plan import plan_transfer
from .regions import RegionRegistry, ShmBudget
from .registrations import Registrations, open_pyverbs
from .rpc_server import Reply, RpcCall
from .staging import StagingBudget
from .staging_buffers import MAX_IDLE_BYTES, StagingBuffers
from .store import ChunkSource, PinFor, PinnedChunks
from .stream_decode import StreamedCopy
from .transfer_info import Delegate, Forecast, Forecaster, PacerFactory, Pacers, TransferInfo, TransferObserver, VerbsOpener, log_transfer
from .transports import FrameSink, OpenRequest, Transport, open_transport, transport_class

__all__ = ["Delegate", "Forecast", "Forecaster", "KVService", "PacerFactory", "Pacers", "TransferInfo", "TransferObserver", "VerbsOpener",
           "log_transfer"]

log = logging.getLogger("objectcache.storage_server")

# A kv-get of at most this many chunks takes its decoded copies on the loop (an fstat per compressed chunk, an open per
# copy: 0.1 ms for 16 measured, 0.45-0.7 ms for 64) rather than in a read thread and back.
INLINE_TAKE_CHUNKS = 16


class KVService:
    def __init__(self, config: Config, chunks: ChunkSource, pacers: Sequence[PacerFactory] = (),
                 open_verbs: VerbsOpener = open_pyverbs) -> None:
        ss = config.storage_server
        self.config = config
        self.chunks = chunks
        zc = config.compression
        self.executor = Executor(ss.read_threads or _cpus(), ss.cold_read_depth, ss.read_path, MemoryBudget(max_bytes=ss.page_cache_max_bytes),
                                 decompress_threads=zc.decompress_threads, dequantise_threads=zc.dequantise_threads,
                                 piece_bytes=zc.piece_bytes, read_ahead_window_bytes=ss.read_ahead_window_bytes)
        self.regions = RegionRegistry(ss.max_regions_per_tenant, populate_max_bytes=ss.populate_max_bytes,
                                      shm=ShmBudget(ss.shm_max_bytes_per_tenant, ss.shm_max_bytes))
        self.staging = StagingBudget(ss.http_staging_bytes, ss.http_staging_tenant_share)
        self.staging_buffers = StagingBuffers(min(MAX_IDLE_BYTES, ss.http_staging_bytes))  # http staging kept between kv-gets
        self.fds = FdBudget()
        copies = zc.copies_budget(config.cache.max_bytes)
        self.copies = DecodedCopies(Path(config.store.data_dir) / "decoded-copies", copies, mapper=chunks.mapper,
                                    stream_threads=zc.decompress_threads) if copies else None
        # A capacity tier's fetches decode compressed chunks as they stream in, two descriptors each meanwhile (the chunk
        # as written, its copy): a kv-get holds those too, for as many chunks as its pin fetches at once.
        self.stream_fds = 0
        if self.copies is not None and zc.decode_on_fetch:
            self.stream_fds = 2 * chunks.decode_while_fetching(functools.partial(StreamedCopy, self.copies))
        self.pacer_factories = list(pacers)
        bw = config.bandwidth
        self.pool = BandwidthPool(
            bw,
            tenant_caps={t.name: t.bandwidth_cap_gbps * GBPS for t in config.tenants if t.bandwidth_cap_gbps > 0},
            tenant_weights={t.name: t.weight for t in config.tenants if t.weight != 1.0},
        ) if bw.enabled else None
        self.registrations = Registrations(config, self.regions, open_verbs)
        self.active: dict[int, TransferInfo] = {}  # keyed per transfer: request ids come from clients' gateways
        self._transfers = itertools.count()
        self._tasks: dict[int, asyncio.Task] = {}  # what runs each active transfer, to stop it at shutdown
        self._prefills: set[asyncio.Task] = set()  # decoded copies queued after kv-puts (the loop keeps tasks weakly)
        self.observers: list[TransferObserver] = [log_transfer]
        self.forecaster: Forecaster | None = None
        self.delegate: Delegate | None = None
        # The cluster's cap on what this node serves its peers (cluster.serve_max_bytes_per_s), shared by the kv-gets
        # its data endpoint streams on a peer's behalf (a ticket naming ``via``); None: uncapped.
        self.peer_pace: Callable[[int], Awaitable[None]] | None = None
        self.completed = 0
        self.bytes_delivered = 0

    # -- small operations --------------------------------------------------------
    async def put(self, call: RpcCall) -> Reply:
        bucket, tenant = call.field("bucket"), call.field("tenant")
        soft_pin_s = float(call.request.fields.get("soft_pin_s", 0.0))
        items = decode_put_batch(call.body)
        if any(bytes(data[:8]) == COMPRESSED_MAGIC for _, data in items):  # their CRCs off the loop
            await asyncio.get_running_loop().run_in_executor(self.executor.pool, check_puts, bucket, items, self.config.compression)
        codec = self.config.compression.codec_for(bucket)
        if codec != "none" and (shape := call.request.fields.get("kv_layout")):
            items = await asyncio.get_running_loop().run_in_executor(
                self.executor.pool, encode_puts, items, ChunkShape.from_header(str(shape)), codec)
        etags = await self.chunks.put_chunks(bucket, items, tenant, soft_pin_s)
        if self.copies is not None and self.config.compression.decode_on_put:
            if stored := [key for key, data in items if bytes(data[:8]) == COMPRESSED_MAGIC]:
                self.copies.arriving(1)
                task = asyncio.get_running_loop().create_task(prefill_after_put(self.chunks, self.copies, self.executor.pool, bucket, stored, tenant))
                self._prefills.add(task)
                task.add_done_callback(self._prefills.discard)
        return PutReply(len(etags), etags).to_json()

    async def lookup(self, call: RpcCall) -> Reply:
        bucket = call.field("bucket")
        keys = decode_keys(call.body)
        found = await self.chunks.longest_prefix(bucket, keys)
        tenant = str(call.request.fields.get("tenant", ""))
        self.chunks.looked_up(tenant, found, len(keys))
        if budget := call.request.fields.get("load_budget"):  # the longest prefix this node expects to land in time
            pool = self.pool.scheduler if self.pool is not None else None
            return LookupReply(found, len(keys), lookup_deliverable(LoadBudget.from_header(str(budget)), found, tenant, self.config, pool)).to_json()
        return LookupReply(found, len(keys)).to_json()

    # -- kv-get ----------------------------------------------------------------------
    async def get(self, call: RpcCall, d: Descriptor | None = None) -> Reply:
        """A kv-get; ``d``: its descriptor, decoded already (the session socket resolves key list references)."""
        arrived = time.perf_counter()
        if d is None:
            d = decode_descriptor(call.body, self.config.storage_server.max_descriptor_keys)
        # Its chunk files open beside the other transfers', never EMFILE; an O_DIRECT twin each where a cold read may go direct.
        kind = transport_class(d.target.transport)
        direct = bool(self.executor.direct_depth) and (kind.reads_into_destination or kind.aligned_staging)
        distinct = getattr(d.chunk_keys, "distinct", None)  # a decoded KeyList counts once per key list
        # A chunk's decoded copy is one more file, reserved only while the node holds copies (a kv-get that did not may
        # not open one: raw-only nodes keep their whole budget for chunk files).
        copy_fds = self.copies is not None and self.copies.holds_any
        files = distinct if distinct is not None else len(set(d.chunk_keys))
        async with self.fds.hold(files, (FDS_PER_FILE if direct else 1) + copy_fds, min(self.stream_fds, 2 * files)):
            last = await self._get(call, d, arrived, copy_fds)
        # The end (or error) frame goes out last: a client that has it sees the kv-get counted and recorded, its chunks
        # unpinned and its descriptors given back. A client gone by then had every byte: the kv-get stays counted.
        if last is not None:
            try:
                await last()
            except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
                log.info("client of %s went away before its end frame", call.request.fields.get("request_id", ""))
        return None

    async def _get(self, call: RpcCall, d: Descriptor, arrived: float, copy_fds: bool = False) -> Callable[[], Awaitable[None]] | None:
        """Run one kv-get; what sends the frame that ends it, called by :meth:`get` once everything is given back
        (None where nothing is left to send)."""
        tenant, bucket = call.field("tenant"), call.field("bucket")
        request_id = str(call.request.fields.get("request_id", ""))
        frames = FrameSink(call.writer, self.config.storage_server.send_stall_s,
                           self.peer_pace if call.request.fields.get("via") else None)
        slot = next(self._transfers)
        snapshot = self.forecaster.snapshot(request_id) if self.forecaster is not None else None
        transport = open_transport(OpenRequest(d, tenant, frames, self.regions, self.staging_buffers))
        pinned, extra_fds, last = None, 0, None
        try:
            if (task := asyncio.current_task()) is not None:
                self._tasks[slot] = task  # stop_transfers stops it, here or served through other nodes (finally forgets it)
            if self.delegate is not None and (delegated := await self._delegated(call, d, transport, frames, slot, arrived)):
                return None if delegated is True else delegated
            pinned = await self.chunks.pin(bucket, d.chunk_keys, PinFor(tenant, request_id, d.chunk_object_bytes, d.num_layers))
            # Raw chunks are exactly L·S bytes; any other is a compressed chunk whose header must agree (read here, off the loop).
            # Counted in C once per resolved prefix and size: a generator over the sizes read the descriptor's property per
            # chunk, 1.0 ms for 3,584 chunks; the count itself compares 3,584 int objects by value, 0.03-0.09 ms a kv-get.
            raw = pinned.derived.get(("raw", d.chunk_object_bytes))
            if raw is None:
                raw = pinned.derived[("raw", d.chunk_object_bytes)] = pinned.sizes.count(d.chunk_object_bytes) == len(pinned.sizes)
            headers = None if raw else await self._headers(d, pinned)
            if headers is not None and not copy_fds and self.copies is not None and self.copies.holds_any:
                # The pin itself made the node's first copies (decoded as they streamed in from the upstream): a descriptor
                # each for them if they fit now (never waiting while holding the chunks'), else this kv-get decodes them.
                extra_fds = self.fds.try_take(len(set(d.chunk_keys)))
                copy_fds = bool(extra_fds)
            forecast = self._forecast(snapshot, d, pinned.paths or {"local": sum(pinned.sizes)})
            plan = plan_transfer(
                d, theta_bytes=self.config.storage_server.theta_bytes, staging=transport_class(d.target.transport).staging,
                staging_budget=self.staging.per_tenant, pool_enabled=self.pool is not None,
                default_compute_per_layer_s=self.config.bandwidth.default_compute_per_layer_s)
            info = TransferInfo(request_id, tenant, bucket, d, plan, forecast, arrived)
            # Validation passed: nothing can fail for the client's input from here on.
            call.writer.write(encode_reply(KVGetAccepted(plan.mode.name.lower(), d.payload_bytes, d.num_layers, transport.tag).to_json()))
            self.active[slot] = info
            outcome, stats = "failed", None
            try:
                work = self._staged(info, ReadPlan.of(d, plan.mode, pinned, plan.piece_chunks, headers), transport, copy_fds)
                setup_s = time.perf_counter() - arrived
                stats = await _until_disconnect(call.reader, work, call.writer)
                stats.request_id, stats.setup_s = request_id, setup_s
                stats.paths = pinned.paths or {"local": sum(pinned.sizes)}
                if via := call.request.fields.get("via"):  # served on a peer's behalf: this node's cache is that node's peer path
                    stats.paths = {f"peer:{via}" if path == "local" else path: n for path, n in stats.paths.items()}
                stats.failovers = pinned.failovers
                last = functools.partial(frames.end, stats.to_json())
                self.completed += 1
                self.bytes_delivered += d.payload_bytes
                outcome = "ok"
            except S3Error as e:
                outcome = "error"
                last = functools.partial(frames.error, e.to_dict())
            except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
                outcome = "client_gone"
                log.info("client of %s went away; transfer stopped", request_id)
            except Exception as e:
                log.exception("transfer %s failed", request_id)
                last = functools.partial(frames.error, S3Error(ErrorCode.InternalError, f"transfer failed: {e.__class__.__name__}").to_dict())
            self._ended(info, outcome, stats)
            return last
        finally:
            self.active.pop(slot, None)
            self._tasks.pop(slot, None)
            try:  # a failing release is logged, never in the way of the end frame
                if pinned is not None:
                    pinned.release()
                transport.close()
            except Exception:
                log.exception("releasing kv-get %s failed", request_id)
            await self.fds.give(extra_fds)

    async def _headers(self, d: Descriptor, pinned: PinnedChunks) -> list[ChunkHeader | None] | None:
        """The compressed chunks' checked headers, read off the loop once per resolved prefix (the same pins: the same
        immutable files); a repeat skips the thread hop and the reads."""
        known = pinned.derived.get(("headers", d.num_layers, d.per_layer_chunk_bytes))
        if known is None:
            known = await asyncio.get_running_loop().run_in_executor(self.executor.pool, read_headers, d, pinned.fds, pinned.offsets, pinned.sizes)
            pinned.derived[("headers", d.num_layers, d.per_layer_chunk_bytes)] = known
        return known

    async def _delegated(self, call: RpcCall, d: Descriptor, transport: Transport, frames: FrameSink, slot: int,
                         arrived: float) -> bool | Callable[[], Awaitable[None]]:
        """The kv-get served through other nodes, if the delegate takes it (False: serve it here); what sends its end
        frame (True: nothing left to send)."""
        assert self.delegate is not None
        tenant, bucket, request_id = call.field("tenant"), call.field("bucket"), str(call.request.fields.get("request_id", ""))
        accepted, setup_s, info = False, 0.0, None

        def accept() -> None:
            nonlocal accepted, setup_s, info
            plan = plan_transfer(d, theta_bytes=self.config.storage_server.theta_bytes, staging=transport_class(d.target.transport).staging,
                                 staging_budget=self.staging.per_tenant, pool_enabled=False,
                                 default_compute_per_layer_s=self.config.bandwidth.default_compute_per_layer_s)
            info = TransferInfo(request_id, tenant, bucket, d, plan)
            accepted, setup_s = True, time.perf_counter() - arrived  # the lookup and the choice of writers
            call.writer.write(encode_reply(KVGetAccepted("layerwise", d.payload_bytes, d.num_layers, transport.tag).to_json()))
            self.active[slot] = info

        outcome, stats, last = "failed", None, None
        try:
            stats = await _until_disconnect(call.reader, self.delegate.delegate(tenant, bucket, request_id, d, transport, accept), call.writer)
            if stats is None:
                return False
            stats.request_id, stats.setup_s = request_id, setup_s
            last = functools.partial(frames.end, stats.to_json())
            self.completed += 1
            self.bytes_delivered += d.payload_bytes
            outcome = "ok"
        except S3Error as e:
            if not accepted:
                raise
            outcome = "error"
            last = functools.partial(frames.error, e.to_dict())
        except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
            outcome = "client_gone"
        except Exception as e:
            if not accepted:
                raise
            log.exception("delegated transfer %s failed", request_id)
            last = functools.partial(frames.error, S3Error(ErrorCode.InternalError, f"transfer failed: {e.__class__.__name__}").to_dict())
        if info is not None:
            self._ended(info, outcome, stats)
        return last or True

    def _forecast(self, snapshot: Any, d: Descriptor, paths: dict[str, int]) -> Forecast | None:
        """The oracle's prediction for this kv-get; a failing forecaster costs the metric, never the kv-get."""
        if self.forecaster is None or snapshot is None:
            return None
        try:
            return self.forecaster.forecast(snapshot, d, paths)
        except Exception:
            log.exception("kv-get forecast failed")
            return None

    def _ended(self, info: TransferInfo, outcome: str, stats: TransferStats | None) -> None:
        for observe in self.observers:
            try:
                observe(info, outcome, stats)
            except Exception:
                log.exception("transfer observer %r failed (request %s)", observe, info.request_id)

    async def _staged(self, info: TransferInfo, reads: ReadPlan, transport: Transport, copy_fds: bool = False) -> TransferStats:
        """Run once the transfer's staging memory fits the budget (http); waiting ends if the client leaves."""
        async with self.staging.hold(info.plan.staging_bytes, info.tenant):
            return await self._paced(info, reads, transport, copy_fds)

    async def _paced(self, info: TransferInfo, reads: ReadPlan, transport: Transport, copy_fds: bool = False) -> TransferStats:
        """Layerwise transfers join the bandwidth pool (when configured); chunkwise ones bypass it."""
        pacers = [p for p in (make(info) for make in self.pacer_factories) if p is not None]
        lease: Lease | None = None
        if self.pool is not None and info.plan.paced:
            d = info.descriptor
            lease = await self.pool.join(info.request_id, info.tenant, TransferDemand(d.layer_bytes, info.plan.compute_per_layer_s, d.num_layers))
            pacers.append(lease)
        if info.descriptor.load_budget_s:
            # First: it must refuse a layer before the lease reserves (and sleeps for) its bytes.
            pacers.insert(0, LoadDeadline(info.arrived + info.descriptor.load_budget_s, info.descriptor.load_budget_s,
                                          lease.bucket if lease is not None else None, self.pool.clock if self.pool is not None else time.monotonic))
        taken = None
        try:
            if self.copies is not None and reads.headers is not None and not reads.send_encoded:  # the node may decode
                taken = (self.copies.take(reads.fds, reads.offsets, reads.headers, reads.slots, copy_fds) if len(reads.fds) <= INLINE_TAKE_CHUNKS
                         else await asyncio.get_running_loop().run_in_executor(self.executor.pool, self.copies.take, reads.fds, reads.offsets,
                                                                               reads.headers, reads.slots, copy_fds))
            site = self._decode_site(info, reads, lease, taken.count if taken is not None else 0)
            if taken is not None and reads.send_encoded:  # the client decodes: the stored bytes, not the copies
                self.copies.release(taken, used=False)  # type: ignore[union-attr]
                taken = None
            elif taken is not None:
                reads.with_copies(taken.fds, taken.offsets, taken.headers, taken.mapped)
                site["decoded_copies"] = taken.count
                if taken.count:  # how they are read: gathered from the mapped arena as raw chunks are, or with preadv
                    site["decoded_copies_read"] = "gathered" if reads.mapped else ("pipeline" if reads.headers is not None else "preadv")
            stats = await self.executor.run(reads, transport, Pacers(pacers) if pacers else None)
            if taken is not None and reads.headers is not None:
                self.copies.fill(taken, reads.fds, reads.headers, info.descriptor.chunk_keys, info.tenant)  # type: ignore[union-attr]
            if lease is not None:
                stats.allocation = lease.describe()
            stats.decode_site = site
            return stats
        finally:
            if taken is not None:
                self.copies.release(taken)  # type: ignore[union-attr]
            if lease is not None and self.pool is not None:
                self.pool.leave(lease)

    def _decode_site(self, info: TransferInfo, reads: ReadPlan, lease: Lease | None, copied: int = 0) -> dict[str, Any]:
        return decode_site(info.descriptor, reads, lease.rate if lease is not None else None, self.executor.decoder.status(),
                           info.plan.compute_per_layer_s, copied)

    def tenant_status(self, tenant: str) -> dict[str, Any]:
        """What one tenant may see: its own transfers and regions, nothing of anybody else's or of the host."""
        leases = self.pool.status()["leases"] if self.pool is not None else {}
        return {
            "transfers_active": [t.describe() for t in self.active.values() if t.tenant == tenant],
            "regions": self.regions.count(tenant),
            "bandwidth": {"enabled": self.pool is not None,
                          "leases": {rid: lease for rid, lease in leases.items() if lease["tenant"] == tenant}},
        }

    def status(self) -> dict[str, Any]:
        """The operator's view of every transfer."""
        return {
            "regions": len(self.regions),
            "rdma_agents": self.registrations.rdma_agents,
            "transfers_active": [t.describe() for t in self.active.values()],
            "transfers_completed": self.completed,
            "bytes_delivered": self.bytes_delivered,
            "http_staging": self.staging.status() | {"kept": self.staging_buffers.status()},
            "page_cache_budget": self.executor.budget.status(),
            "transfer_fds": self.fds.status() | {"stream_decode_fds": self.stream_fds},
            "bandwidth": self.pool.status() if self.pool is not None else {"enabled": False},
            "decode_pipeline": self.executor.decoder.status(),
            "gather_lanes": self.executor.lanes,
            "decoded_copies": self.copies.status() if self.copies is not None else {"max_bytes": 0},
        }

    async def stop_transfers(self) -> None:
        """Stop every transfer still running (their streams are cut; pins and transports are released) before the
        stores close under them."""
        tasks = list(self._tasks.values()) + list(self._prefills)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
        self.executor.close()
        if self.copies is not None:
            self.copies.close()
        self.regions.close()
        self.registrations.close()


def _cpus() -> int:
    return os.cpu_count() or 2


async def _until_disconnect(reader: asyncio.StreamReader, work: Awaitable[TransferStats], writer: asyncio.StreamWriter) -> TransferStats:
    """Run ``work`` in this task but stop it as soon as the peer closes the connection (even while paused), or when
    this task is cancelled itself (shutdown): ``work`` never outlives this call.

    ``work`` runs in the caller's task, the watcher cancelling it when the peer goes: a task of its own beside the
    watcher (``asyncio.wait`` on both) cost two trips through the event loop per kv-get, one before its first read
    and one after its last frame (timestamps, shm G64x64: 0.09 and 0.035 ms)."""
    task = asyncio.current_task()
    assert task is not None
    before = task.cancelling()  # cancels asked of this task already (ours is told apart from them by the count)
    watcher = asyncio.ensure_future(reader.read(1))
    running, gone = True, False

    def peer_gone(_: asyncio.Future) -> None:
        nonlocal gone
        if running:
            gone = True
            task.cancel()

    watcher.add_done_callback(peer_gone)
    try:
        try:
            result = await work
        except (Exception, asyncio.CancelledError) as e:
            running = False
            # Our cancel taken back; the peer's going is what ended the work, whatever it raised on its way out (a read
            # thread's error, a send to the closed socket). A cancel anyone else asked for (a shutdown) goes on as one.
            if gone and task.uncancel() <= before:
                raise ConnectionAbortedError("the client closed the stream") from e
            raise
        running = False
        if gone:
            task.uncancel()  # the work finished with our cancel swallowed (e.g. a wait_for whose result came in that turn)
        return result
    finally:
        running = False
        watcher.remove_done_callback(peer_gone)
        watcher.cancel()
        # The watcher's read ends before the connection's next (a session connection serves another kv-get after this
        # one: a read still waiting made that one's fail). A byte it took mid-transfer breaks the stream: the client
        # sends nothing until the END frame, so such a connection is not kept.
        await asyncio.gather(watcher, return_exceptions=True)
        if not watcher.cancelled() and watcher.exception() is None and watcher.result():
            writer.transport.abort()
