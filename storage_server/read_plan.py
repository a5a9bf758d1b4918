"""What the executor reads (:class:`ReadPlan`: the descriptor, the mode chosen, the pinned chunks' files, and
their mapped arena's rows when every chunk is mapped in one) and the END frame's report of a transfer."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from protocol.wire import Descriptor, Mode, TransferStats

from .compressed_reads import ChunkHeader
from .store import PinnedChunks
from .store.mapped_files import MappedSlot


@dataclass
class ReadPlan:
    """What the executor reads: the descriptor, the mode chosen, and the pinned chunks' files in prefix order."""

    descriptor: Descriptor
    mode: Mode
    fds: list[int]
    offsets: list[int]  # where each chunk starts in its file
    piece_chunks: int  # layerwise: chunks read (and delivered) at a time
    rows: np.ndarray | None = None  # every chunk mapped: the arena as rows of S bytes ...
    first_rows: np.ndarray | None = None  # ... and each chunk's layer-0 row in it
    # Some chunk is compressed: each chunk's header (None: raw). Its layer slices are not S bytes at
    # ℓ·S, so such a plan takes neither the mapped gather nor O_DIRECT groups: the decode pipeline reads them.
    headers: list[ChunkHeader | None] | None = None
    # Slices go as stored in ENCODED frames, the client decodes (CLIENT_DECODES, or DECODE_AUTO's choice).
    send_encoded: bool = False
    # Every sampled chunk was in the page cache: a mapped piece up to INLINE_GATHER_BYTES is gathered on the loop.
    warm: bool = False
    # A warm mapped piece off the loop is split into one run per core; False: one run (the engine computes each layer
    # for longer than one thread takes to gather the next, see :func:`one_run_keeps_ahead`).
    spread: bool = True
    # A plan with compressed chunks: the pinned chunks' mappings, for when decoded copies replace them (:meth:`with_copies`).
    slots: list[MappedSlot | None] | None = None

    @classmethod
    def of(cls, descriptor: Descriptor, mode: Mode, pinned: PinnedChunks, piece_chunks: int,
           headers: list[ChunkHeader | None] | None = None) -> "ReadPlan":
        if headers is not None or descriptor.client_decodes:
            return cls(descriptor, mode, pinned.fds, pinned.offsets, piece_chunks, headers=headers, send_encoded=descriptor.client_decodes,
                       slots=pinned.mapped)
        s = descriptor.per_layer_chunk_bytes
        known = pinned.derived.get(("rows", s))  # the same pins as a transfer before (a resolved prefix)
        if known is None:
            known = pinned.derived.setdefault(("rows", s), _source_rows(pinned, s) or _mapped_rows(pinned.mapped, pinned.offsets, s))
        rows, first_rows = known
        return cls(descriptor, mode, pinned.fds, pinned.offsets, piece_chunks, rows, first_rows)

    def with_copies(self, fds: list[int], offsets: list[int], headers: list[ChunkHeader | None] | None,
                    slots: list[MappedSlot | None] | None) -> None:
        """Read decoded copies in place of their compressed chunks (``fds``…: the columns with the copies in). Once no
        chunk is left to decode the plan is a raw one, gathered from the arena exactly as raw chunks are when every
        chunk (raw or copy) is mapped in one; the copies' slots are held by the caller until the transfer ends."""
        self.fds, self.offsets, self.headers, self.slots = fds, offsets, headers, slots
        if headers is None and slots is not None:
            self.rows, self.first_rows = _mapped_rows(slots, offsets, self.descriptor.per_layer_chunk_bytes)

    @property
    def mapped(self) -> bool:
        return self.rows is not None


def one_run_keeps_ahead(first_layer_s: float, runs: int, compute_window: tuple[float, ...]) -> bool:
    """Whether one thread gathering each later layer stays ahead of the engine (pure): layer 0 took ``first_layer_s``
    on ``runs`` threads, so one takes at most ``runs`` times as long, against the shortest per-layer compute the
    descriptor names (none named: the engine's pace is unknown, every core is used).

    bench ttft, 64K@87.5% at G=16 (28 MiB layers, 9.5 ms of compute each): the storage server's two copy threads
    finished the transfer at 79 ms of a 326 ms TTFT while taking both cores from the serving loop and its compute
    thread, which then woke late (+2.3% against the best local loader; one thread per layer keeps every layer
    ahead and a core free)."""
    return bool(compute_window) and runs * first_layer_s < min(compute_window)


def _source_rows(pinned: PinnedChunks, size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Rows of ``size`` bytes and each chunk's first row when every chunk is in one row source (the memory a capacity
    tier's kv-get received its peers' chunks into, :mod:`storage_server.store.s3.arrivals`)."""
    source = pinned.derived.get("row_source")
    if source is None or size <= 0 or source.row_bytes % size:
        return None
    return source.rows(size), np.arange(len(pinned.fds), dtype=np.intp) * (source.row_bytes // size)


def _mapped_rows(mapped: list[MappedSlot | None], offsets: list[int], size: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The arena's rows of ``size`` bytes and each chunk's first row, if every chunk is mapped whole in one arena."""
    first = mapped[0] if mapped and size > 0 else None
    if first is None or (rows := first.arena.rows(size)) is None or any(offsets):
        return None, None
    arena = first.arena
    try:
        slots = [m.index for m in mapped if m.arena is arena]  # type: ignore[union-attr]
    except AttributeError:  # one is not mapped
        return None, None
    if len(slots) != len(mapped):
        return None, None
    return rows, np.asarray(slots, np.intp) * (arena.slot_bytes // size)


def _stats(plan: ReadPlan, timeline: list[list[float]], read_s: float, deliver_s: float, started: float, first_layer_s: float) -> TransferStats:
    """The END frame's report of a transfer that started at ``started``."""
    return TransferStats(
        # To the microsecond in one numpy call: round() per value was 51 µs of a 32-layer kv-get's time to its END (timeit).
        layer_timeline=np.round(np.array(timeline, dtype=np.float64), 6).tolist() if timeline else [],
        mode=plan.mode.name.lower(),
        payload_bytes=plan.descriptor.payload_bytes,
        storage_read_s=read_s,
        delivery_s=deliver_s,
        total_s=time.perf_counter() - started,
        first_layer_s=first_layer_s,
    )
