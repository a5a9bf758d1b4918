"""One part of a kv-get's payload written into the engine's registered memory, layer by layer (peer -> engine, rdma).

The same loop runs on a peer (B, serving its part of another node's kv-get from its own cache)
and on the kv-get's node (A, its own share of a split, or a failed part's remaining layers):
per layer, the part's slices are read from the pinned chunk files into one registered staging
buffer (the part's chunks are adjacent in the destination, so a layer's share is one
contiguous write), CRC32C'd while hot, written one-sidedly, and reported with ``on_layer``
once landed. ``fenced`` is asked before each layer and before every step of each write: once
it says so, nothing more is written (:class:`~storage_server.transports.nixl_engine.Fenced`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

import numpy as np
from awscrt import checksums as crt

from protocol.cluster_write import WritePart

from ..store.chunk_source import PinnedChunks
from ..transports.nixl_engine import Fenced, NixlLink

OnLayer = Callable[[int, int], Awaitable[None]]  # layer, CRC32C of the part's share of it


def _read_share(pinned: PinnedChunks, first: int, count: int, layer: int, s: int, dest: np.ndarray) -> int:
    """The layer's slices of pinned chunks ``first..first+count`` into ``dest``; their CRC32C."""
    view = memoryview(dest)
    for j in range(count):
        got = os.preadv(pinned.fds[first + j], [view[j * s : (j + 1) * s]], pinned.offsets[first + j] + layer * s)
        if got != s:
            raise OSError(f"short read of a chunk file ({got} of {s} bytes)")
    return crt.crc32c(view[: count * s])


async def write_part(link: NixlLink, pinned: PinnedChunks, first: int, part: WritePart, base: int, s: int, num_chunks: int,
                     on_layer: OnLayer, fenced: Callable[[], bool] = lambda: False,
                     before_layer: Callable[[int], Awaitable[None]] | None = None) -> None:
    """Write ``part`` (its chunks are ``pinned`` from index ``first``) into ``link``'s region, whose payload starts at
    ``base``; ``s`` is one chunk's slice of one layer. Fenced when ``fenced`` says so."""
    loop = asyncio.get_running_loop()
    share = part.chunks * s
    staging = np.empty(share, np.uint8)
    handle = link.register(staging)
    try:
        for layer in range(part.layer_lo, part.layer_hi):
            if fenced():
                raise Fenced
            if before_layer is not None:
                await before_layer(share)
            crc = await loop.run_in_executor(None, _read_share, pinned, first, part.chunks, layer, s, staging)
            offset = base + layer * num_chunks * s + part.chunk_lo * s
            await link.write(staging, handle, offset, fenced)
            await on_layer(layer, crc)
    finally:
        link.deregister(handle)
