"""The transfer plan: how one validated kv-get will run, as a pure function of numbers.

Mode (paper eq. 2: payloads below Θ go chunkwise, the rest layerwise, unless the
client chose), the staging memory the transport holds in this server (a
chunkwise ``http`` payload larger than the whole staging budget is sent
layerwise instead: the same bytes, bounded memory), and the per-layer compute
window the bandwidth allocator weighs (the mean of the descriptor's window, or
the configured default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from protocol.errors import ErrorCode, S3Error
from protocol.wire import Descriptor, Mode


@dataclass(frozen=True)
class TransferPlan:
    mode: Mode
    staging_bytes: int  # server memory held for the transfer's bytes (0: they go straight to the client)
    paced: bool  # joins the bandwidth pool
    compute_per_layer_s: float
    piece_chunks: int  # layerwise: chunks read and delivered at a time


@dataclass(frozen=True)
class Staging:
    """How a transport holds bytes in this server: not at all, or in rotating pieces of bounded size
    (layerwise) and the whole payload (chunkwise)."""

    in_server: bool
    pieces_in_rotation: int = 0
    max_piece_bytes: int = 0


def check_chunk_sizes(d: Descriptor, sizes: Sequence[int]) -> None:
    """Every chunk object must be exactly L·S bytes; the error names the first that is not."""
    expected = d.chunk_object_bytes
    if list(sizes).count(expected) == len(sizes):
        return
    for key, size in zip(d.chunk_keys, sizes):
        if size != expected:
            raise S3Error(
                ErrorCode.KVChunkSizeMismatch,
                f"chunk {key!r} is {size} bytes, expected num_layers*per_layer_chunk_bytes = {expected}",
                extra={"Key": key, "ActualSize": str(size), "ExpectedSize": str(expected)},
            )


def plan_transfer(d: Descriptor, *, theta_bytes: int, staging: Staging, staging_budget: int, pool_enabled: bool,
                  default_compute_per_layer_s: float) -> TransferPlan:
    mode = d.mode
    if mode == Mode.AUTO:
        mode = Mode.CHUNKWISE if d.payload_bytes < theta_bytes else Mode.LAYERWISE
    n, s = len(d.chunk_keys), d.per_layer_chunk_bytes
    piece_chunks, staged = n, 0
    if staging.in_server:
        if mode == Mode.CHUNKWISE and d.payload_bytes > staging_budget:
            mode = Mode.LAYERWISE
        if mode == Mode.CHUNKWISE:
            staged = d.payload_bytes
        else:
            if s * staging.pieces_in_rotation > staging_budget:
                raise S3Error(ErrorCode.KVInvalidDescriptor,
                              f"per_layer_chunk_bytes: {s} bytes per chunk slice cannot be staged within this server's http staging "
                              f"budget ({staging_budget} bytes for {staging.pieces_in_rotation} pieces); use the shm transport",
                              extra={"Field": "per_layer_chunk_bytes"})
            piece_cap = min(staging.max_piece_bytes, staging_budget // staging.pieces_in_rotation)
            piece_chunks = max(1, min(n, piece_cap // s))
            pieces = -(-n // piece_chunks) * d.num_layers
            staged = piece_chunks * s * min(staging.pieces_in_rotation, pieces)
    window = d.compute_window
    compute = sum(window) / len(window) if window else default_compute_per_layer_s
    return TransferPlan(mode, staged, pool_enabled and mode == Mode.LAYERWISE, compute, piece_chunks)
