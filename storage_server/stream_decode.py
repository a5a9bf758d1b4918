"""A compressed chunk decoded layer by layer while it streams in from the upstream, into a decoded copy.

A cold capacity-tier kv-get used to fetch every chunk whole into the cache (the pin) and only then decode them: the
upstream link and the decoders took turns, so compressed chunks reached the engine later than raw ones unless the bytes
saved outweighed the whole decode (profile: see the commit). A chunk's encoded layer slices lie in order after its
header, so layer ℓ can be decoded as soon as its bytes are written: :class:`StreamedCopy` is fed after each piece the
fetch writes and hands each layer it completes to the stream-decode pool (``compression.decompress_threads`` workers,
:attr:`DecodedCopies.stream_pool`), so the fetch never waits for the decoder (decoding in the fetch's own thread
stalled it: int4+zstd at a 50 MB/s upstream fetched in 526 ms instead of 201). The layers decode into a decoded copy
(:class:`~storage_server.decoded_copies.DecodedCopies`, a read copy's room); when the chunk is committed to the cache,
:meth:`StreamedCopy.finish` waits for its layers and keeps the copy under that cache file's identity: the kv-get that
pinned it then reads the copy, gathered like a raw chunk, and decodes nothing.

A kv-get reserves a descriptor per chunk for copies when it arrives only if the node holds any (raw-only nodes keep
their whole budget); one whose pin made the node's first copies takes those descriptors after the pin where they fit
(:meth:`~storage_server.fd_budget.FdBudget.try_take`), so even the node's first cold kv-get reads its copies instead
of decoding the chunks a second time.

It only ever saves work: any failure (no room, a bad chunk, an I/O error) abandons the copy and the kv-get decodes the
chunk itself as before (and refuses a bad one with the error naming the key and field). Raw chunks are left alone after
their first piece.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Executor, Future, wait
from pathlib import Path

import numpy as np

from protocol.codecs import BATCH_BYTES
from protocol.compressed_chunk import FIXED_HEADER_BYTES, MAGIC, ChunkHeader, decode_header, head_of
from scheduler.codec_choice import decode_while_fetching

from .decoded_copies import DecodedCopies, identity

log = logging.getLogger("objectcache.storage_server.stream_decode")


class StreamedCopy:
    """One fetched chunk's decode as it streams in (see the module docstring). Fed by one fetch, in order."""

    def __init__(self, copies: DecodedCopies, key: str, tenant: str, size: int, upstream_bytes_per_s: float | None = None) -> None:
        """``size``: the object's bytes, as the upstream announced them (the fetch checks it got exactly those);
        ``upstream_bytes_per_s``: the rate chunks arrive at (None: not measured yet)."""
        self.copies, self.key, self.tenant, self.size = copies, key, tenant, size
        self.arrival = upstream_bytes_per_s
        self.pool: Executor = copies.stream_pool
        self.header: ChunkHeader | None = None
        self.off = False  # a raw chunk, no room, or a failure: nothing more to do
        self.submitted = 0  # layers handed to the pool so far
        self._tasks: list[Future] = []
        self._tmp: Path | None = None
        self._src = self._dst = -1  # the chunk file as it is written (valid across its commit's rename), the copy

    def feed(self, path: Path, written: int) -> None:
        """``written`` bytes of the chunk are in ``path`` now: hand every layer they complete to the pool."""
        if self.off:
            return
        try:
            if self.header is None and not self._parse(path, written):
                return
            self._submit(written)
        except Exception:
            log.warning("decoding chunk %r as it arrived failed (the kv-get decodes it)", self.key, exc_info=True)
            self.abandon()

    def _submit(self, written: int) -> None:
        """The layers ``written`` bytes complete, decoded in batches (one lossy pass over each: Codec.decode_many)."""
        h = self.header
        assert h is not None
        first, per = self.submitted, max(1, BATCH_BYTES // h.slice_bytes)
        while self.submitted < h.layers and h.offsets[self.submitted] + h.lengths[self.submitted] <= written:
            self.submitted += 1
        for a in range(first, self.submitted, per):  # tasks of about BATCH_BYTES of output, side by side on the pool
            self._tasks.append(self.pool.submit(self._decode, a, min(a + per, self.submitted)))

    def _decode(self, first: int, last: int) -> None:
        """Layers first..last-1 (their encoded slices lie back to back in the chunk) decoded into the copy."""
        h = self.header
        assert h is not None
        s = h.slice_bytes
        start = h.offsets[first]
        encoded = memoryview(os.pread(self._src, h.offsets[last - 1] + h.lengths[last - 1] - start, start))
        out = np.empty((last - first) * s, np.uint8)
        # Wall time, waits for a core and the GIL included: what streaming costs beside the fetch on a busy host (CPU
        # time made every chunk stream on a 2-core host, and the cold kv-gets got slower: see the commit).
        t0 = time.perf_counter()
        h.decode_layers(self.key, first, h.encoded_slices(encoded, first, last, at=start), out)
        self.copies.stream_decoded(h.codec.name, out.nbytes, time.perf_counter() - t0)
        if os.pwrite(self._dst, memoryview(out), first * s) != out.nbytes:
            raise OSError("short write of decoded layers")

    def _parse(self, path: Path, written: int) -> bool:
        """The header, once its bytes are in (False: not yet); a raw chunk or no room turns this copy off."""
        if written < len(MAGIC):
            return False
        with open(path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                self.off = True
                return False
            if written < FIXED_HEADER_BYTES:
                return False
            f.seek(0)
            need = head_of(f.read(FIXED_HEADER_BYTES))
            if not need or written < need:
                self.off = not need
                return False
            f.seek(0)
            head = f.read(need)
        h = decode_header(self.key, head, self.size)
        if not decode_while_fetching(self.arrival, h.layers * h.slice_bytes / self.size, self.copies.stream_rate(h.codec.name)):
            self.off = True  # the decoders would fall behind the link: the kv-get decodes after the fetch, on its whole pipeline
            self.copies.stream_declined += 1
            return False
        tmp = self.copies.reserve(h.layers * h.slice_bytes, self.tenant)
        if tmp is None:
            self.off = True
            return False
        self.header, self._tmp = h, tmp
        self._src = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._dst = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return True

    def finish(self, committed: Path) -> None:
        """The whole chunk is committed to the cache at ``committed`` (the file this copy's source descriptor still
        reads): decode the rest, wait for every layer, keep the copy for that file."""
        if self.off or self.header is None:
            self.abandon()
            return
        try:
            self._submit(self.size)
            wait(self._tasks)
            for t in self._tasks:
                t.result()  # a layer's error (a bad CRC: the kv-get refuses the chunk itself)
            ident = identity(self._src, 0)
            if ident[2] != self.size:
                raise OSError(f"the committed chunk is {ident[2]} bytes, not {self.size}")
            self._close()
            tmp, self._tmp = self._tmp, None
            assert tmp is not None
            self.copies.adopt(ident, tmp, self.header.layers * self.header.slice_bytes, self.tenant)
        except Exception:
            log.warning("decoding chunk %r as it arrived failed (the kv-get decodes it)", self.key, exc_info=True)
            self.abandon()

    def abandon(self) -> None:
        """No copy after all: layers not started are dropped, running ones finish (they write into the copy's file),
        then its room and file are given back."""
        self.off = True
        for t in self._tasks:
            t.cancel()
        wait(self._tasks)
        self._tasks = []
        self._close()
        if self._tmp is not None and self.header is not None:
            self.copies.unreserve(self._tmp, self.header.layers * self.header.slice_bytes, self.tenant)
            self._tmp = None

    def _close(self) -> None:
        for fd in (self._src, self._dst):
            if fd >= 0:
                os.close(fd)
        self._src = self._dst = -1
