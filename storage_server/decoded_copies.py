"""Decoded copies of compressed chunks: a warm kv-get the node would decode reads a raw copy instead.

Chunks stored compressed hold more prefixes per byte, but every warm hit the node decodes (shm and
rdma always, http where the decode site is the node) pays the decoder: on a fast link the decoder,
not the link, is then the slowest stage, and a compressed prefix loads slower than a raw one would.
Within ``compression.decoded_copies_bytes`` (on by default: ``CompressionConfig.copies_budget``) the
node keeps a raw copy (L·S bytes, layer-major) of each compressed chunk it decoded for a kv-get; the
next kv-get that the node would decode reads the copy as a raw chunk. A kv-get whose SDK decodes (a
slow link: the encoded bytes are what it wants) reads the stored object as before.

A copy is keyed by the identity of the exact file the store pinned (device, inode, size, mtime and
ctime in nanoseconds, and the chunk's offset in it). An overwrite or a delete leaves another file, so a
copy is never served for other bytes than the ones it was decoded from, and the store's pin (with its
authorisation) always comes first: a copy reaches no tenant the stored chunk would not. Copies are a
cache: kept in their own folder (emptied at start), least recently used evicted past the budget (never
one a transfer reads), filled after the kv-get that decoded them on one background thread over a
bounded queue (a full queue skips a copy: it only ever saves work).

A copy is served exactly as a raw chunk is: each is mapped at a slot of the store's arenas (the same
:class:`~storage_server.store.mapped_files.MappedFiles` as the store's own chunk files, so a prefix of raw chunks and
copies is one arena of L·S-byte slots) and the executor gathers a layer of them with one ``np.take``, warm and small
pieces on the event loop. A copy a transfer reads is never evicted, so its slot is never unmapped or given to another
file under that transfer; an evicted copy is unmapped before its slot can be reused, and forgotten, so nothing reads
its rows afterwards. Copies map at most half of the mapper's bound (the store's own chunk files keep the rest); past it
a copy is read with ``preadv`` like an unmapped raw chunk.

With ``compression.decode_on_put`` (the default) the node also copies each compressed chunk a kv-put stored, right
after the put (:meth:`DecodedCopies.prefill`): then the chunk's *first* kv-get on a fast link reads a copy too, instead
of waiting for the decoder. The fill thread runs at nice 19 (a kv-get's own decode goes first), and such speculative
copies never evict a copy a kv-get read, nor more than their share of other tenants' (:mod:`.copy_eviction`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
from collections import OrderedDict
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from protocol.compressed_chunk import ChunkHeader

from .compressed_reads import stored_headers
from .copy_eviction import Held, victims
from .fd_budget import soft_fd_limit
from .store.chunk_source import ChunkSource
from .store.mapped_files import MappedFiles, MappedSlot
from .thread_priority import lowest_priority

log = logging.getLogger("objectcache.storage_server.decoded_copies")

Identity = tuple[int, int, int, int, int, int]


def identity(fd: int, offset: int) -> Identity:
    """The pinned bytes' identity: an immutable chunk file as the store wrote it, and where the chunk starts in it."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, offset


@dataclass
class _Copy:
    path: Path
    size: int
    readers: int = 0
    slot: MappedSlot | None = None  # where the copy is mapped (None: read with preadv)
    tenant: str = ""  # whose kv-get or kv-put made it
    speculative: bool = False  # made after a kv-put, not read by any kv-get yet


@dataclass
class Taken:
    """One kv-get's use of the copies: the plan's columns with each copy in place of its chunk, the copies it reads
    (open here, closed on release) and the identities of the compressed chunks it still decodes (what a fill after it
    may copy)."""

    ids: list[Identity | None]  # per chunk: the identity of a compressed chunk the node decodes, else None
    fds: list[int]
    offsets: list[int]
    headers: list[ChunkHeader | None] | None  # None: every chunk is raw now (no decode at all)
    mapped: list[MappedSlot | None] | None = None  # per chunk: its mapping (a copy's own in place of its chunk's)
    used: list[Identity] = field(default_factory=list)
    opened: list[int] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.used)


class DecodedCopies:
    """Raw copies of decoded chunks within ``max_bytes`` in ``root`` (see the module docstring)."""

    def __init__(self, root: Path, max_bytes: int, queue_chunks: int | None = None, mapper: MappedFiles | None = None,
                 stream_threads: int = 2) -> None:
        """``queue_chunks``: fills queued at most (each holds a duplicate of its chunk's file descriptor, outside the
        transfers' budget: by default 4,096 or an eighth of the file limit, whichever is smaller). ``mapper``: the
        store's mappings (raw chunks and copies then gather together); None: copies get their own."""
        shutil.rmtree(root, ignore_errors=True)  # copies of a previous run name files that may no longer exist
        root.mkdir(parents=True)
        self.root, self.max_bytes = root, max_bytes
        self.queue_chunks = queue_chunks if queue_chunks is not None else max(1, min(4096, soft_fd_limit() // 8))
        self._copies: OrderedDict[Identity, _Copy] = OrderedDict()  # least recently used first
        self._pending: set[Identity] = set()
        self._bytes = 0
        # Bytes of copies being written, by (tenant, speculative): held in the budget and counted as that tenant's by
        # the fair eviction rule (as copies a transfer reads: never evicted) until the copy is kept or dropped.
        self._writing: dict[tuple[str, bool], int] = {}
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="decoded-copies", initializer=lowest_priority)
        # Decodes of chunks streaming in from an upstream (storage_server.stream_decode): a kv-get waits for these.
        self.stream_pool = ThreadPoolExecutor(stream_threads, thread_name_prefix="stream-decode")
        self.stream_threads = stream_threads
        self._stream_meter: dict[str, tuple[int, float]] = {}  # codec -> (raw bytes decoded, thread-seconds)
        self.stream_declined = 0  # chunks not decoded while fetched: the decoders would have fallen behind the link
        self._names = 0
        self._closed = False
        self.hits = self.fills = self.evicted = self.skipped = 0
        self.prefills = self.prefill_skipped = self.streamed = 0  # copies made after a kv-put; ones skipped (no room within the rules)
        self._pending_prefills = 0
        self._arriving = 0  # kv-puts whose chunks are still being pinned for prefill (counted as pending)
        self._own_mapper = mapper is None
        self.mapper = mapper if mapper is not None else MappedFiles(1 << 16)

    @property
    def holds_any(self) -> bool:
        """Whether a copy exists (a kv-get then reserves a descriptor per chunk for its copy)."""
        return bool(self._copies)

    def take(self, fds: list[int], offsets: list[int], headers: list[ChunkHeader | None],
             mapped: list[MappedSlot | None] | None = None, open_copies: bool = True) -> Taken:
        """The plan's columns (and the chunks' mappings) with each compressed chunk that has a copy replaced by the copy
        (a raw chunk at offset 0, mapped where it could be); the copies stay readable, and mapped at the same slots,
        until :meth:`release`. A stat per compressed chunk and an open per copy: the caller runs a large kv-get's off the
        event loop. ``open_copies`` False (no descriptors were reserved for copies): none is read, the identities are
        still taken for the fill."""
        ids: list[Identity | None] = [identity(fd, off) if h is not None else None for fd, off, h in zip(fds, offsets, headers)]
        fds, offsets, headers = list(fds), list(offsets), list(headers)
        slots = list(mapped) if mapped is not None else [None] * len(fds)
        taken = Taken(ids, fds, offsets, headers, slots)
        with self._lock:
            for j, ident in enumerate(ids):
                copy = self._copies.get(ident) if ident is not None and open_copies else None
                if copy is None:
                    continue
                try:
                    fd = os.open(copy.path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:  # removed by hand: forget it
                    self._drop(ident)  # type: ignore[arg-type]
                    continue
                copy.readers += 1
                copy.speculative = False  # a kv-get wanted it: an ordinary copy from now on
                self._copies.move_to_end(ident)  # type: ignore[arg-type]
                taken.used.append(ident)  # type: ignore[arg-type]
                taken.opened.append(fd)
                taken.ids[j] = None
                fds[j], offsets[j], headers[j], slots[j] = fd, 0, None, copy.slot
        if not any(h is not None for h in headers):
            taken.headers = None
        return taken

    def release(self, taken: Taken, used: bool = True) -> None:
        """The kv-get is over (``used``: it read the copies; False: it sent the stored bytes instead)."""
        for fd in taken.opened:
            os.close(fd)
        with self._lock:
            self.hits += taken.count if used else 0
            for ident in taken.used:
                if (copy := self._copies.get(ident)) is not None:
                    copy.readers -= 1
            self._evict(0)
        taken.opened, taken.used = [], []

    def fill(self, taken: Taken, fds: list[int], headers: list[ChunkHeader | None], keys: list[str], tenant: str = "") -> None:
        """After a kv-get that decoded its compressed chunks: queue a copy of each not copied yet (the pinned files
        are duplicated, so the copies outlive the pins)."""
        self._queue(taken.ids, fds, headers, keys, tenant, False)

    def prefill(self, fds: list[int], offsets: list[int], headers: list[ChunkHeader | None], keys: list[str], tenant: str) -> None:
        """Right after a kv-put stored these chunks (pinned by the caller): queue a speculative copy of each compressed
        one not copied yet. A stat per chunk: the caller runs it off the event loop. At most half the fill queue holds
        speculative fills, so a kv-get's fills still find room."""
        if self._closed:
            return
        ids = [identity(fd, off) if h is not None else None for fd, off, h in zip(fds, offsets, headers)]
        self._queue(ids, fds, headers, keys, tenant, True)

    def arriving(self, delta: int) -> None:
        """A kv-put's prefill starts (+1) or has queued its fills (-1): until then ``status()['pending']`` counts it."""
        with self._lock:
            self._arriving += delta

    def _queue(self, ids: list[Identity | None], fds: list[int], headers: list[ChunkHeader | None], keys: list[str], tenant: str,
               speculative: bool) -> None:
        jobs = []
        with self._lock:
            for j, ident in enumerate(ids):
                h = headers[j]
                if ident is None or h is None or ident in self._copies or ident in self._pending:
                    continue
                full = (self._pending_prefills >= self.queue_chunks // 2) if speculative else len(self._pending) >= self.queue_chunks
                if full or h.layers * h.slice_bytes > self.max_bytes:
                    if speculative:
                        self.prefill_skipped += 1
                    else:
                        self.skipped += 1
                    continue
                self._pending.add(ident)
                self._pending_prefills += speculative
                jobs.append((ident, os.dup(fds[j]), h, keys[j], tenant, speculative))
        for job in jobs:
            self._worker.submit(self._fill_one, *job)

    def _fill_one(self, ident: Identity, fd: int, header: ChunkHeader, key: str, tenant: str = "", speculative: bool = False) -> None:
        try:
            if self._closed:
                return
            if speculative:  # no decode for a copy that could not be kept (the room is checked again after it)
                with self._lock:
                    if self._victims(header.layers * header.slice_bytes, tenant, True) is None:
                        self.prefill_skipped += 1
                        return
            encoded = np.empty(header.object_bytes, np.uint8)
            got = os.preadv(fd, [memoryview(encoded)], ident[5])
            if got != header.object_bytes:
                raise OSError(f"short read: {got} of {header.object_bytes} bytes")
            s = header.slice_bytes
            raw = np.empty(header.layers * s, np.uint8)
            header.decode_layers(key, 0, header.encoded_slices(encoded), raw)
            with self._lock:
                self._names += 1
                path = self.root / f"{self._names:016x}"
                if not self._evict(raw.nbytes, tenant, speculative):
                    if speculative:
                        self.prefill_skipped += 1
                    else:
                        self.skipped += 1
                    return
                self._write(tenant, speculative, raw.nbytes)  # reserved before the write: the budget holds while it runs
            slot = None
            try:
                tmp = path.with_suffix(".tmp")
                with open(tmp, "w+b") as f:  # readable: the mapping needs it
                    f.write(memoryview(raw))
                    f.flush()
                    if self._mapped_copies() < self.mapper.max_mapped // 2:  # the store's own chunk files keep half the mappings
                        slot = self.mapper.map(f.fileno(), raw.nbytes)  # None past the mapping bound: read with preadv
                os.rename(tmp, path)
            except BaseException:
                if slot is not None:
                    self.mapper.unmap(slot)
                with self._lock:
                    self._write(tenant, speculative, -raw.nbytes)
                raise
            with self._lock:
                self._write(tenant, speculative, -raw.nbytes)
                if self._closed:  # close() unmapped every copy already: this one must not outlive the arenas
                    if slot is not None:
                        self.mapper.unmap(slot)
                    path.unlink(missing_ok=True)
                    return
                self._bytes += raw.nbytes  # now the kept copy's
                self._copies[ident] = _Copy(path, raw.nbytes, slot=slot, tenant=tenant, speculative=speculative)
                if speculative:
                    self.prefills += 1
                else:
                    self.fills += 1
        except Exception:
            log.exception("decoded copy of chunk %r failed (it is decoded again next time)", key)
        finally:
            os.close(fd)
            with self._lock:
                self._pending.discard(ident)
                self._pending_prefills -= speculative

    # -- copies decoded while their chunk streams in (storage_server.stream_decode) -------------------------------
    def reserve(self, nbytes: int, tenant: str) -> Path | None:
        """Room for a copy a kv-get waits for (a read copy's rules), and the file to write it into; None: no room."""
        with self._lock:
            if self._closed or nbytes > self.max_bytes or not self._evict(nbytes, tenant, False):
                self.skipped += 1
                return None
            self._write(tenant, False, nbytes)
            self._names += 1
            return self.root / f"{self._names:016x}.tmp"

    def stream_decoded(self, codec: str, nbytes: int, seconds: float) -> None:
        with self._lock:
            b, s = self._stream_meter.get(codec, (0, 0.0))
            self._stream_meter[codec] = (b + nbytes, s + seconds)

    def stream_rate(self, codec: str) -> float | None:
        """Raw bytes/s the stream-decode pool decodes ``codec`` at (all its workers); None before it decoded any."""
        with self._lock:
            b, s = self._stream_meter.get(codec, (0, 0.0))
        return b / s * self.stream_threads if s > 0 else None

    def unreserve(self, tmp: Path, nbytes: int, tenant: str) -> None:
        tmp.unlink(missing_ok=True)
        with self._lock:
            self._write(tenant, False, -nbytes)

    def adopt(self, ident: Identity, tmp: Path, nbytes: int, tenant: str) -> None:
        """A reserved copy fully written at ``tmp``: kept (mapped where the bound allows) for the chunk file ``ident``."""
        path, slot = tmp.with_suffix(""), None
        try:
            with open(tmp, "r+b") as f:
                if self._mapped_copies() < self.mapper.max_mapped // 2:
                    slot = self.mapper.map(f.fileno(), nbytes)
            os.rename(tmp, path)
        except BaseException:
            if slot is not None:
                self.mapper.unmap(slot)
            self.unreserve(tmp, nbytes, tenant)
            raise
        with self._lock:
            self._write(tenant, False, -nbytes)
            if self._closed or ident in self._copies:
                if slot is not None:
                    self.mapper.unmap(slot)
                path.unlink(missing_ok=True)
                return
            self._bytes += nbytes  # now the kept copy's
            self._copies[ident] = _Copy(path, nbytes, slot=slot, tenant=tenant)
            self.streamed += 1

    def _mapped_copies(self) -> int:
        with self._lock:
            return sum(c.slot is not None for c in self._copies.values())

    def _victims(self, room: int, tenant: str, speculative: bool) -> list | None:
        held = [Held(i, c.size, c.tenant, c.speculative, c.readers) for i, c in self._copies.items()]
        held += [Held(("writing", t, spec), n, t, spec, readers=1) for (t, spec), n in self._writing.items() if n]
        return victims(held, self._bytes, self.max_bytes, room, tenant, speculative)

    def _write(self, tenant: str, speculative: bool, nbytes: int) -> None:
        """(Lock held.) ``nbytes`` more (or, negative, fewer) of ``tenant``'s copies are being written."""
        self._bytes += nbytes
        key = (tenant, speculative)
        self._writing[key] = self._writing.get(key, 0) + nbytes
        if not self._writing[key]:
            del self._writing[key]

    def _evict(self, room: int, tenant: str = "", speculative: bool = False) -> bool:
        """Make ``room`` more bytes fit by the rules of :mod:`.copy_eviction` (lock held); False: they cannot (then
        nothing is evicted)."""
        out = self._victims(room, tenant, speculative)
        if out is None:
            return False
        for ident in out:
            self._drop(ident)
            self.evicted += 1
        return True

    def _drop(self, ident: Identity) -> None:
        """Forget a copy no transfer reads (lock held): unmapped first, so its slot is free only once nothing maps it."""
        copy = self._copies.pop(ident)
        self._bytes -= copy.size
        if copy.slot is not None:
            self.mapper.unmap(copy.slot)
            copy.slot = None
        copy.path.unlink(missing_ok=True)

    def status(self) -> dict[str, int]:
        with self._lock:
            return {"max_bytes": self.max_bytes, "bytes": self._bytes, "chunks": len(self._copies), "hits": self.hits,
                    "fills": self.fills, "evicted": self.evicted, "skipped": self.skipped, "pending": len(self._pending) + self._arriving,
                    "prefills": self.prefills, "prefill_skipped": self.prefill_skipped, "streamed": self.streamed,
                    "stream_declined": self.stream_declined,
                    "speculative_bytes": sum(c.size for c in self._copies.values() if c.speculative),
                    "mapped": sum(c.slot is not None for c in self._copies.values()), "max_mapped": self.mapper.max_mapped // 2}

    def close(self) -> None:
        """Stop filling (queued fills only close their files) and unmap every copy (before the store's arenas go; no
        transfer runs any more)."""
        self._closed = True
        self._worker.shutdown(wait=True)
        self.stream_pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for ident in list(self._copies):
                self._drop(ident)
        if self._own_mapper:
            self.mapper.close()


async def prefill_after_put(chunks: ChunkSource, copies: DecodedCopies, pool: Executor, bucket: str, keys: list[str], tenant: str) -> None:
    """After a kv-put stored compressed chunks: queue their decoded copies (``compression.decode_on_put``), so their
    first kv-get on a fast link reads copies. It only ever saves work: a failure is logged, never the put's. The caller
    counted it with ``copies.arriving(1)`` before starting it."""
    try:
        pinned = await chunks.pin_held(bucket, keys)
        if pinned is None:
            return
        try:
            def queue() -> None:
                headers = stored_headers(keys, pinned.fds, pinned.offsets, pinned.sizes)
                copies.prefill(pinned.fds, pinned.offsets, headers, keys, tenant)
            await asyncio.get_running_loop().run_in_executor(pool, queue)
        finally:
            pinned.release()
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("decoded copies after a kv-put of %d chunks into %r failed (their first kv-get decodes)", len(keys), bucket)
    finally:
        copies.arriving(-1)
