"""One missing chunk from the upstream into the s3 backend's cache, and the rate chunks arrive at.

A chunk is one whole-object GET, streamed into a temp file a piece at a time (a thread hop per
write), then committed and pinned for the kv-get that asked (pinned at the commit: a decoder's
last step runs on a thread after it, and an unpinned chunk could be evicted by another kv-get's
reservation meanwhile). Where decoded copies are kept, a decoder is fed as the chunk streams in
(:mod:`storage_server.stream_decode`), so decoding overlaps the upstream link; it is told the
measured arrival rate, all fetches together.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from protocol.errors import ErrorCode, S3Error

from ..cache.chunk_files import ChunkFiles
from .chunk_writes import StreamFeed, write_fed
from .upstream import Upstream, body_chunks

WRITE_PIECE = 1 << 20  # a fetched chunk's bytes per write (a thread hop each)
FED_PIECE = 1 << 18  # ... while a decoder is fed as it streams in (its layers reach the decoders sooner)


class _Overtaken(Exception):
    """A write through this node overtook the GET: its bytes are not committed."""


class UpstreamFetches:
    """The capacity tier's GETs of missing chunks into its cache."""

    def __init__(self, up: Upstream, files: ChunkFiles) -> None:
        self.up, self.files = up, files
        self.fetched = 0
        # Set by the KV service where decoded copies are kept: a decoder fed as each fetched chunk streams in
        # (key, tenant, size, arrival rate -> None for no decode).
        self.stream_decoder: Callable[[str, str, int, float | None], StreamFeed | None] | None = None
        # Encoded bytes/s arriving from the upstream, all fetches together: bytes over the wall time at least one fetch
        # was receiving, averaged over recent such periods; None before the first.
        self.bytes_per_s: float | None = None
        self._fetching, self._period_bytes, self._period_start = 0, 0, 0.0

    async def fetch(self, bucket: str, key: str, cid: str, tenant: str = "", stale: Callable[[], bool] | None = None) -> bool:
        """``key`` from the upstream into the cache as ``cid``, committed pinned (the caller's pin); False, with nothing
        committed, where ``stale()`` says a write through this node overtook the GET (its bytes may be the old ones)."""
        resource = f"/{bucket}/{key}"
        resp = await self.up.get(bucket, key, resource=resource)
        body = resp["Body"]
        size = int(resp["ContentLength"])
        etag = str(resp.get("ETag", ""))
        if not self.files.reserve(size, tenant):
            body.close()
            raise S3Error(ErrorCode.ServiceUnavailable, "The chunk cache is full of chunks other transfers hold "
                          f"(cache.max_bytes = {self.files.max_bytes}); retry.", resource)
        tmp = self.files.new_tmp()
        feed = self.stream_decoder(key, tenant, size, self.bytes_per_s) if self.stream_decoder is not None else None
        self._receiving(+1)
        try:
            loop = asyncio.get_running_loop()
            tmp.touch()
            written, held, held_bytes = 0, [], 0
            try:
                # A chunk decoding as it streams in reaches its decoders every FED_PIECE bytes (256 KiB); others are written a WRITE_PIECE at a time
                async for piece in body_chunks(body, FED_PIECE if feed is not None else WRITE_PIECE, resource):
                    written += len(piece)
                    self._period_bytes += len(piece)
                    held.append(piece)
                    held_bytes += len(piece)
                    if held_bytes >= (FED_PIECE if feed is not None and not feed.off else WRITE_PIECE):
                        await loop.run_in_executor(None, write_fed, tmp, held, feed, written)
                        held, held_bytes = [], 0
                if held:
                    await loop.run_in_executor(None, write_fed, tmp, held, feed, written)
            finally:
                self._receiving(-1)
            if tmp.stat().st_size != size:
                raise S3Error(ErrorCode.ServiceUnavailable, "The upstream store sent a short chunk; retry.", resource)
            if stale is not None and stale():
                raise _Overtaken
        except BaseException as e:
            body.close()
            self.files.unreserve(size)
            tmp.unlink(missing_ok=True)
            if feed is not None:
                feed.abandon()
            if isinstance(e, _Overtaken):
                return False
            raise
        path = self.files.commit(cid, tmp, size, etag, tenant=tenant)
        # Pinned as it is committed: while the decoder finishes on a thread below, another kv-get's reservation could
        # otherwise evict the chunk this one is about to read (it then failed with NoSuchKey).
        self.files.policy.pin([cid])
        self.fetched += 1
        if feed is not None:  # the layers not decoded yet, and the copy kept for this very file (before the pin returns)
            try:
                await loop.run_in_executor(None, feed.finish, path)
            except BaseException:
                self.files.policy.unpin([cid])
                raise
        return True

    def _receiving(self, delta: int) -> None:
        """A fetch starts (+1) or stops (-1) receiving; a period with any receiving ends: its rate joins the average."""
        now = time.monotonic()
        if self._fetching == 0 and delta > 0:
            self._period_bytes, self._period_start = 0, now
        self._fetching += delta
        if self._fetching == 0 and (took := now - self._period_start) > 0 and self._period_bytes >= 1 << 16:
            rate = self._period_bytes / took
            self.bytes_per_s = rate if self.bytes_per_s is None else 0.7 * self.bytes_per_s + 0.3 * rate
