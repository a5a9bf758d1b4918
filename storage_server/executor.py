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
    piece_chunks: int  # layerwise: chunks read (and delivered) at a time

    @classmethod
    def of(cls, descriptor: Descriptor, mode: Mode, handles: list[ChunkHandle], piece_chunks: int) -> "ReadPlan":
        return cls(descriptor, mode, [h.fd for h in handles], [h.offset for h in handles], piece_chunks)


def _read_run(fds: list[int], offsets: list[int], first: int, last: int, base: int, file_offset: int, size: int, dest: memoryview) -> None:
    """Read ``[file_offset, +size)`` of chunks first..last-1 into ``dest`` at ``(j - base)·size`` (prefix order)."""
    pos = (first - base) * size
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

    def _runs(self, first: int, last: int) -> list[tuple[int, int]]:
        n = last - first
        k = max(1, min(self.io_threads, n))
        bounds = [first + n * i // k for i in range(k + 1)]
        return [(bounds[i], bounds[i + 1]) for i in range(k) if bounds[i] < bounds[i + 1]]

    async def _read_runs(self, fn, plan: ReadPlan, first: int, last: int, *args) -> None:
        """Run ``fn(fds, offsets, a, b, *args)`` over contiguous runs ``[a, b)`` of chunks first..last-1 on the read pool.

        If one run fails, the others are waited for before the error propagates,
        so no thread is still writing into a buffer the caller is about to free.
        """
        loop = asyncio.get_running_loop()
        futures = [loop.run_in_executor(self.pool, fn, plan.fds, plan.offsets, a, b, *args) for a, b in self._runs(first, last)]
        try:
            await asyncio.gather(*futures)
        except BaseException:
            await asyncio.gather(*futures, return_exceptions=True)
            raise

    async def read_piece(self, plan: ReadPlan, layer: int, first: int, last: int, dest: memoryview) -> None:
        """Slice ``layer`` of chunks first..last-1, in prefix order, into ``dest``."""
        s = plan.descriptor.per_layer_chunk_bytes
        await self._read_runs(_read_run, plan, first, last, first, layer * s, s, dest)

    async def run(self, plan: ReadPlan, transport: Transport, pacer: Pacer | None = None) -> TransferStats:
        """Execute ``plan`` into ``transport``; returns statistics for the END frame.

        Layerwise, each layer is read in pieces of ``plan.piece_chunks`` chunks
        (one piece per layer when the destination is the client's memory; bounded
        pieces when the transport stages bytes in this server). A piece's delivery
        (its CRC, its bytes over ``http``) overlaps the reads of the next piece,
        pieces and layers are delivered strictly in order, and a staging buffer is
        reused only once the piece in it was delivered.
        ``pacer.before_layer(nbytes)`` is awaited before each layer is read and
        ``pacer.after_layer()`` called once it is read (layerwise only).
        """
        d = plan.descriptor
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        read_s = deliver_s = first_layer_s = 0.0
        if plan.mode == Mode.CHUNKWISE:
            dest = transport.payload_buffer()
            t0 = time.perf_counter()
            await self._read_runs(_read_whole_chunks, plan, 0, len(plan.fds), len(plan.fds), d.num_layers, d.per_layer_chunk_bytes, dest)
            crcs = (await loop.run_in_executor(self.pool, _crc_layers, dest, d.layer_bytes, d.num_layers)
                    if d.layer_checksums else [0] * d.num_layers)
            t1 = time.perf_counter()
            await transport.deliver_payload(dest, crcs)
            read_s, deliver_s = t1 - t0, time.perf_counter() - t1
            first_layer_s = time.perf_counter() - started  # every layer is ready at once
        else:
            deliveries: list[asyncio.Task] = []  # one per piece, in order
            deliver_time = [0.0]
            crc = [0]  # running CRC32C of the layer being delivered
            first_ready = [0.0]

            async def deliver(layer: int, first: int, data: memoryview, ends_layer: bool, previous: asyncio.Task | None) -> None:
                if previous is not None:
                    await previous  # strict order (and the CRC chains piece by piece)
                if d.layer_checksums:
                    crc[0] = await loop.run_in_executor(self.pool, crc32c, data, crc[0])
                t = time.perf_counter()
                await transport.deliver_piece(layer, first, data)
                if ends_layer:
                    await transport.layer_ready(layer, crc[0])
                    crc[0] = 0
                    if layer == 0:
                        first_ready[0] = time.perf_counter() - started
                deliver_time[0] += time.perf_counter() - t

            n, k = len(plan.fds), plan.piece_chunks
            pieces = [(a, min(a + k, n)) for a in range(0, n, k)]
            reuse = transport.buffers_in_rotation
            try:
                for layer in range(d.num_layers):
                    if reuse and len(deliveries) >= reuse:
                        await deliveries[-reuse]  # the layer's first buffer is free (not waited for while holding a dispatch slot)
                    if pacer is not None:
                        await pacer.before_layer(d.layer_bytes)
                    t0 = time.perf_counter()
                    try:
                        for first, last in pieces:
                            if reuse and len(deliveries) >= reuse:
                                await deliveries[-reuse]  # that buffer is free again
                            dest = transport.piece_buffer(layer, first, last)
                            await self.read_piece(plan, layer, first, last, dest)
                            previous = deliveries[-1] if deliveries else None
                            if previous is not None and previous.done():
                                previous.result()  # a failed delivery (client gone) stops the reads now
                            deliveries.append(asyncio.ensure_future(deliver(layer, first, dest, last == n, previous)))
                    finally:
                        if pacer is not None:
                            pacer.after_layer()
                    read_s += time.perf_counter() - t0
                await deliveries[-1]
            except BaseException:
                for t in deliveries:
                    t.cancel()
                await asyncio.gather(*deliveries, return_exceptions=True)
                raise
            deliver_s, first_layer_s = deliver_time[0], first_ready[0]
        return TransferStats(
            mode=plan.mode.name.lower(),
            payload_bytes=d.payload_bytes,
            storage_read_s=read_s,
            delivery_s=deliver_s,
            total_s=time.perf_counter() - started,
            first_layer_s=first_layer_s,
        )
