"""The descriptor executor: range reads of chunk objects, layer-major assembly, in-order delivery.

Layerwise, for ℓ = 0..L-1: the slice ``[ℓS, (ℓ+1)S)`` of every chunk is read
with ``preadv`` straight into the layer's destination (chunk j at ``j·S``) by a
bounded thread pool (each task reads a contiguous run of chunks, so Python
overhead is per run, not per slice, and the GIL is released during reads);
the layer's CRC32C (unless the descriptor waives it) is computed off the event
loop and, like the delivery of layer ℓ, overlaps the reads of layer ℓ+1; layers
are delivered strictly in order.

Chunkwise, each chunk object is read whole by one scatter ``preadv`` whose
iovecs land its L slices at their layer-major places; all notifications come
at the end.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from awscrt.checksums import crc32c

from protocol.errors import ErrorCode, S3Error
from protocol.wire import Descriptor, Mode, TransferStats

from .store import ChunkHandle
from .transports import Transport

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


class Pacer(Protocol):
    """Paces layer reads (the bandwidth pool's lease, or whatever a test injects)."""

    async def before_layer(self, nbytes: int) -> None: ...

    def after_layer(self) -> None: ...


@dataclass
class ReadPlan:
    """What the executor reads: the descriptor, the mode chosen, and the pinned chunks' files in prefix order."""

    descriptor: Descriptor
    mode: Mode
    fds: list[int]
    offsets: list[int]  # where each chunk starts in its file

    @classmethod
    def of(cls, descriptor: Descriptor, mode: Mode, handles: list[ChunkHandle]) -> "ReadPlan":
        return cls(descriptor, mode, [h.fd for h in handles], [h.offset for h in handles])


def _read_run(fds: list[int], offsets: list[int], first: int, last: int, file_offset: int, size: int, dest: memoryview) -> None:
    """Read ``[file_offset, +size)`` of chunks first..last-1 into ``dest`` at ``j·size`` (prefix order)."""
    pos = first * size
    for j in range(first, last):
        n = os.preadv(fds[j], [dest[pos : pos + size]], offsets[j] + file_offset)
        if n != size:
            raise S3Error(ErrorCode.InternalError, f"short read of chunk #{j}: {n} of {size} bytes")
        pos += size


def _read_whole_chunks(fds: list[int], offsets: list[int], first: int, last: int, n_chunks: int, layers: int, size: int, dest: memoryview) -> None:
    """Scatter-read whole chunk objects into layer-major places."""
    stride = n_chunks * size
    for j in range(first, last):
        iov = [dest[layer * stride + j * size : layer * stride + (j + 1) * size] for layer in range(layers)]
        for k in range(0, layers, IOV_MAX):
            part = iov[k : k + IOV_MAX]
            if os.preadv(fds[j], part, offsets[j] + k * size) != size * len(part):
                raise S3Error(ErrorCode.InternalError, f"short read of chunk #{j}")


def _crc_layers(data: memoryview, layer_bytes: int, layers: int) -> list[int]:
    return [crc32c(data[i * layer_bytes : (i + 1) * layer_bytes]) for i in range(layers)]


class Executor:
    """Runs plans on a bounded read pool shared by all transfers of this server."""

    def __init__(self, io_threads: int) -> None:
        self.pool = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="kv-read")
        self.io_threads = io_threads

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def _runs(self, n: int) -> list[tuple[int, int]]:
        k = max(1, min(self.io_threads, n))
        bounds = [n * i // k for i in range(k + 1)]
        return [(bounds[i], bounds[i + 1]) for i in range(k) if bounds[i] < bounds[i + 1]]

    async def _read_runs(self, fn, plan: ReadPlan, *args) -> None:
        """Run ``fn(fds, offsets, first, last, *args)`` over contiguous runs of chunks on the read pool.

        If one run fails, the others are waited for before the error propagates,
        so no thread is still writing into a buffer the caller is about to free.
        """
        loop = asyncio.get_running_loop()
        futures = [loop.run_in_executor(self.pool, fn, plan.fds, plan.offsets, first, last, *args) for first, last in self._runs(len(plan.fds))]
        try:
            await asyncio.gather(*futures)
        except BaseException:
            await asyncio.gather(*futures, return_exceptions=True)
            raise

    async def read_layer(self, plan: ReadPlan, layer: int, dest: memoryview) -> None:
        s = plan.descriptor.per_layer_chunk_bytes
        await self._read_runs(_read_run, plan, layer * s, s, dest)

    async def run(self, plan: ReadPlan, transport: Transport, pacer: Pacer | None = None) -> TransferStats:
        """Execute ``plan`` into ``transport``; returns statistics for the END frame.

        ``pacer.before_layer(nbytes)`` is awaited before each layer is read and
        ``pacer.after_layer()`` called once it is read (layerwise only).
        """
        d = plan.descriptor
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        read_s = deliver_s = 0.0
        if plan.mode == Mode.CHUNKWISE:
            dest = transport.payload_buffer()
            t0 = time.perf_counter()
            await self._read_runs(_read_whole_chunks, plan, len(plan.fds), d.num_layers, d.per_layer_chunk_bytes, dest)
            crcs = (await loop.run_in_executor(self.pool, _crc_layers, dest, d.layer_bytes, d.num_layers)
                    if d.layer_checksums else [0] * d.num_layers)
            t1 = time.perf_counter()
            await transport.deliver_payload(dest, crcs)
            read_s, deliver_s = t1 - t0, time.perf_counter() - t1
        else:
            deliveries: list[asyncio.Task] = []
            deliver_time = [0.0]

            async def deliver(layer: int, data: memoryview, previous: asyncio.Task | None) -> None:
                # The CRC runs while the next layer is being read.
                crc = await loop.run_in_executor(self.pool, crc32c, data) if d.layer_checksums else 0
                if previous is not None:
                    await previous  # strict layer order
                t = time.perf_counter()
                await transport.deliver(layer, data, crc)
                deliver_time[0] += time.perf_counter() - t

            reuse = transport.buffers_in_rotation
            try:
                for layer in range(d.num_layers):
                    if reuse and layer >= reuse:
                        await deliveries[layer - reuse]  # that buffer is free again
                    if pacer is not None:
                        await pacer.before_layer(d.layer_bytes)
                    dest = transport.layer_buffer(layer)
                    t0 = time.perf_counter()
                    try:
                        await self.read_layer(plan, layer, dest)
                    finally:
                        if pacer is not None:
                            pacer.after_layer()
                    read_s += time.perf_counter() - t0
                    previous = deliveries[-1] if deliveries else None
                    if previous is not None and previous.done():
                        previous.result()  # a failed delivery (client gone) stops the reads now
                    deliveries.append(asyncio.ensure_future(deliver(layer, dest, previous)))
                await deliveries[-1]
            except BaseException:
                for t in deliveries:
                    t.cancel()
                await asyncio.gather(*deliveries, return_exceptions=True)
                raise
            deliver_s = deliver_time[0]
        return TransferStats(
            mode=plan.mode.name.lower(),
            payload_bytes=d.payload_bytes,
            storage_read_s=read_s,
            delivery_s=deliver_s,
            total_s=time.perf_counter() - started,
        )

