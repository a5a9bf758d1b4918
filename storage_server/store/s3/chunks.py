"""The s3 backend's chunk source: write-through to the upstream, a bounded local cache for reads.

* **kv-put** stores every chunk upstream (acknowledged only once the upstream has it: a
  conditional ``PUT If-None-Match: *``, identical re-puts are no-ops) and keeps a copy in
  the cache when there is room.
* **kv-get** pins: cached chunks are pinned at once, missing ones are fetched as whole
  objects (``cache.fetch_concurrency`` GETs at a time, one GET per missing chunk, never
  one per layer slice), written to the cache and pinned; the executor then range-reads
  the local files exactly as with the local-disk store.
* **kv-lookup** counts the leading cached chunks and confirms the last of them with one
  HEAD (a prefix deleted through another node is then searched for within the cached run,
  and the cached copies past the answer are dropped), then asks the upstream about the
  rest: the first unknown key, then a binary search over the monotone prefix chain
  (chunks are put head first): ``1 + ceil(log2(n))`` HEADs for ``n`` uncached keys, 13 for
  a 3,584-key (64K-token) prefix, one more when some are cached. A hole inside a chain (a
  single chunk deleted in the middle) can make the answer too long; the kv-get then names
  the missing key, or serves the cached copy (byte-correct: chunks are immutable).

A second source (:attr:`S3ChunkSource.second`: the cluster's peers, :mod:`storage_server.cluster`)
is asked first for the chunks a kv-get misses; it writes whole chunks through the cache
(:meth:`S3ChunkSource.store_fetched`) and whatever it could not bring comes from the upstream.

Chunks are cached under (bucket incarnation, key), so a bucket deleted and created again
by someone else never sees the old bucket's cached bytes. Changes made through this
process's store drop the cached copy; a delete through *another* node is seen by the next
kv-lookup of the prefix (above), and by a kv-get within ``revalidate_after_s``: a cached
copy not confirmed for that long is checked with one HEAD (its ETag against the version
the copy holds) before it is served, and a deleted or replaced chunk is dropped (then
fetched again, or NoSuchKey). A warm kv-get of recently confirmed chunks asks the upstream
about no chunk.
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from protocol.errors import ErrorCode, S3Error
from protocol.kv_http import CHUNK_CONTENT_TYPE

from ..cache.chunk_files import ChunkFiles, chunk_id, version_tag
from ..cache.tenants import TenantQuotas
from ..chunk_source import ChunkSource, PinFor, PinnedChunks
from ..mapped_files import MappedFiles
from ..object_store import PutSpec
from ..open_files import MissingFile, OpenFileCache
from .arrivals import Arrivals, Owed, pinned_with_arrivals
from .buckets import check_key
from .chunk_writes import StreamFeed, append_pieces, as_stream, write_each
from .store import S3Store
from .upstream_fetch import UpstreamFetches

CHUNK_SPEC = PutSpec(content_type=CHUNK_CONTENT_TYPE, immutable=True)
FETCH_TRIES = 3  # GETs of one missing chunk that a write through this node overtook, before the kv-get is told to retry


@dataclass
class Filled:
    """What a second source brought for one pin: the chunks it pinned (cached now, by it or by another request meanwhile),
    ``brought`` those it cached itself (this pin's misses), bytes per path, failovers; and, with ``arrivals``, the raw
    chunks received straight into memory (``arrivals.landed``: by row; ``rows``: each wanted chunk's row; ``claimed``:
    the chunk ids whose landing in the cache this pin owes, after its kv-get)."""

    pinned: list[str] = field(default_factory=list)
    brought: list[str] = field(default_factory=list)
    paths: dict[str, int] = field(default_factory=dict)
    failovers: int = 0
    arrivals: Arrivals | None = None
    rows: list[int] = field(default_factory=list)
    claimed: list[str] = field(default_factory=list)


class SecondSource(Protocol):
    async def fill(self, bucket: str, bucket_id: str, wanted: list[tuple[str, str]], pin_for: PinFor,
                   cache: "S3ChunkSource", filled: Filled) -> None:
        """Fetch what it can of ``wanted`` ((key, chunk id), in prefix order) through ``cache``, recording in ``filled``
        as it goes (so a pin that fails or is cancelled meanwhile unpins what it brought); never raises for a failed path."""


class S3ChunkSource(ChunkSource):
    def __init__(self, store: S3Store, cache_dir: Path, max_bytes: int, fetch_concurrency: int, revalidate_after_s: float = 60.0,
                 policy: str = "prefix", quotas: TenantQuotas | None = None, open_files: int = 0) -> None:
        self.store, self.up = store, store.up
        self.files = ChunkFiles(cache_dir, max_bytes, policy, quotas)
        # Cached chunk files kept open and mapped between kv-gets, as the local store's are: a layer of mapped chunks
        # is one gather, where a preadv per slice read a warm 64 MB prefix (256 chunks x 32 layers) in 190 ms.
        # A refetched chunk is written at the same name, so every unlink is forgotten by the cache.
        self.open = OpenFileCache(open_files, MappedFiles(2 * open_files) if open_files else None)
        self.files.unlinked = lambda path: self.open.forget(os.fspath(path))
        self.ledger = self.files.ledger
        self.concurrency = fetch_concurrency
        self.revalidate_after_s = revalidate_after_s
        self.revalidated = 0
        self._bucket_ids: dict[str, str] = {}
        self._inflight: dict[str, asyncio.Future[None]] = {}
        self._stale_claims: set[str] = set()  # claimed (being fetched) chunks deleted or overwritten meanwhile
        self.arrived = self.arrived_cached = 0  # chunks peers sent straight into kv-gets' memory; those cached after
        self.second: SecondSource | None = None
        self.fetches = UpstreamFetches(self.up, self.files)  # one GET per missing chunk, into the cache
        store.listeners.append(self._invalidate)

    def decode_while_fetching(self, decoder: Callable[[str, str, int, float | None], StreamFeed | None]) -> int:
        self.fetches.stream_decoder = decoder
        return self.concurrency  # a pin's fetches at once (pin's gate): each may be decoding

    @property
    def record_s(self) -> float | None:
        """What every pin spends before it touches a chunk: a read of the bucket's record (its owner and incarnation)
        from the upstream, on each request unless ``store.s3.bucket_record_ttl_s`` lets a process reuse it (0 then);
        measured, None until the first read."""
        return 0.0 if self.store.buckets.ttl_s > 0 else self.store.buckets.read_s

    async def _ids(self, bucket: str, keys: list[str]) -> list[str]:
        """The cache ids of ``keys``; every KV path (put, lookup, pin) passes here, so here ObjectCache's own
        records (keys under ``.objectcache/``) are refused, never confirmed nor served as chunks."""
        for key in keys:
            check_key(bucket, key)
        bid = self._bucket_ids[bucket] = await self.store.bucket_id(bucket)
        return [chunk_id(bid, k) for k in keys]

    def _invalidate(self, bucket: str, keys: list[str]) -> None:
        bid = self._bucket_ids.get(bucket)
        if bid is not None:
            for key in keys:
                cid = chunk_id(bid, key)
                self.files.drop(cid)
                if cid in self._inflight:  # being fetched: what arrives must not be cached
                    self._stale_claims.add(cid)

    # -- lookup ----------------------------------------------------------------
    async def longest_prefix(self, bucket: str, keys: list[str]) -> int:
        cids = await self._ids(bucket, keys)
        cached = next((i for i, c in enumerate(cids) if self.files.size(c) is None), len(cids))
        if cached and not await self.up.exists(bucket, keys[cached - 1]):
            # Deleted through another node: the upstream decides within the cached run, and the copies past the answer go.
            found = await self._search(bucket, keys, 0, cached - 1)
            for cid in cids[found:cached]:
                self.files.drop(cid)
            return found
        if cached == len(keys) or not await self.up.exists(bucket, keys[cached]):
            return cached
        return await self._search(bucket, keys, cached + 1, len(keys))

    async def _search(self, bucket: str, keys: list[str], lo: int, hi: int) -> int:
        """The longest stored prefix when ``keys[:lo]`` are known stored and the answer is at most ``hi`` (a binary search of HEADs)."""
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if await self.up.exists(bucket, keys[mid - 1]):
                lo = mid
            else:
                hi = mid - 1
        return lo

    # -- put -------------------------------------------------------------------
    async def put_chunks(self, bucket: str, items: list[tuple[str, memoryview]], owner: str, soft_pin_s: float = 0.0) -> list[str]:
        if soft_pin_s:
            raise S3Error(ErrorCode.NotImplemented, "soft pins (x-oc-soft-pin-ttl) are not yet supported on the s3 backend")
        cids = await self._ids(bucket, [k for k, _ in items])
        gate = asyncio.Semaphore(self.concurrency)

        async def one(key: str, data: memoryview) -> str:
            async with gate:
                return (await self.store.put_object(bucket, key, as_stream(data), CHUNK_SPEC, owner)).etag

        etags = await asyncio.gather(*(one(k, d) for k, d in items))
        for i in reversed(range(len(items))):  # the head written last is the newest
            cid, data, etag = cids[i], items[i][1], etags[i]
            if self.files.size(cid) is None and self.files.reserve(len(data), owner):
                tmp = self.files.new_tmp()
                try:
                    await asyncio.get_running_loop().run_in_executor(None, append_pieces, tmp, [bytes(data)])
                except BaseException:
                    self.files.unreserve(len(data))
                    tmp.unlink(missing_ok=True)
                    raise
                self.files.commit(cid, tmp, len(data), etag, cids[i - 1] if i else None, owner)
        return list(etags)

    # -- pin -------------------------------------------------------------------
    async def _fetch_pinned(self, bucket: str, key: str, cid: str, tenant: str = "") -> bool:
        """Pin ``cid``, fetching it whole into the cache first (counted as ``tenant``'s) unless it is there (or another
        request is fetching it); whether this call fetched it."""
        for _ in range(3):
            if self.files.size(cid) is not None:
                self.files.policy.pin([cid])
                return False
            inflight = self._inflight.get(cid)
            if inflight is None:
                break
            await asyncio.wait([inflight])
        done = self._inflight[cid] = asyncio.get_running_loop().create_future()
        try:
            for _ in range(FETCH_TRIES):
                # Overwritten or deleted through this node during the GET: what arrived may be the old bytes. They are
                # never committed (committed, another kv-get could be served them before they were dropped, and they
                # would replace what the write cached); the chunk is fetched again (a delete: NoSuchKey).
                if await self.fetches.fetch(bucket, key, cid, tenant, lambda: cid in self._stale_claims):
                    return True  # pinned from its commit on; a write after the commit drops it as for any cached chunk
                self._stale_claims.discard(cid)
                if self.files.size(cid) is not None:  # the write cached its own bytes meanwhile
                    self.files.policy.pin([cid])
                    return False
            raise S3Error(ErrorCode.ServiceUnavailable, f"chunk {key!r} changed {FETCH_TRIES} times while it was fetched; retry.",
                          f"/{bucket}/{key}")
        finally:
            self._stale_claims.discard(cid)
            del self._inflight[cid]
            done.set_result(None)

    # -- what a second source uses ---------------------------------------------------
    async def fetch_upstream_pinned(self, bucket: str, key: str, cid: str, tenant: str = "") -> bool:
        """The upstream path for one chunk, as a kv-get's own misses take it (a second source running its share of a
        split beside its peers'); whether this call fetched it (False: it was cached or another request fetched it)."""
        return await self._fetch_pinned(bucket, key, cid, tenant)

    def claim(self, cid: str) -> bool:
        """Take the fetch of ``cid`` (False: cached, or another request is fetching it); :meth:`release` after."""
        if self.files.size(cid) is not None or cid in self._inflight:
            return False
        self._inflight[cid] = asyncio.get_running_loop().create_future()
        return True

    def stale(self, cid: str) -> bool:
        """Whether ``cid``, claimed, was deleted or overwritten through this node since (what arrives is not cached)."""
        return cid in self._stale_claims

    def release(self, cid: str) -> None:
        self._stale_claims.discard(cid)
        done = self._inflight.pop(cid, None)
        if done is not None and not done.done():
            done.set_result(None)

    async def store_fetched(self, cid: str, data: bytes, version: str = "", tenant: str = "") -> bool:
        """A whole chunk fetched elsewhere (a peer's copy of upstream ``version``), written through the cache and pinned
        (False: no room, nothing kept). Its version makes it revalidated like a copy fetched from the upstream."""
        return (await self.store_fetched_many([(cid, data, version)], tenant))[0]

    async def store_fetched_many(self, chunks: list[tuple[str, bytes, str]], tenant: str = "") -> list[bool]:
        """:meth:`store_fetched` for several ``(cid, data, version)`` at once: their files written in one trip to a
        worker thread (a peer stream lands a few chunks at a time: a thread hop per chunk held its loop up)."""
        room = [self.files.reserve(len(data), tenant) for _, data, _ in chunks]
        kept = [(c, self.files.new_tmp()) for c, ok in zip(chunks, room) if ok]
        try:
            await asyncio.get_running_loop().run_in_executor(None, write_each, [(tmp, data) for (_, data, _), tmp in kept])
        except BaseException:
            for (_, data, _), tmp in kept:
                self.files.unreserve(len(data))
                tmp.unlink(missing_ok=True)
            raise
        for (cid, data, version), tmp in kept:
            self.files.commit(cid, tmp, len(data), version, tenant=tenant)
            self.files.policy.pin([cid])
        return room

    def cached_size(self, bucket_id: str, key: str) -> tuple[str, int | None]:
        """The chunk id of (bucket incarnation, key) and its cached size (None: not in the cache)."""
        cid = chunk_id(bucket_id, key)
        return cid, self.files.size(cid)

    async def _revalidate(self, bucket: str, keys: list[str], cids: list[str]) -> None:
        """Check cached copies not confirmed within ``revalidate_after_s`` against the upstream (a HEAD each, its ETag);
        one deleted or replaced there is dropped, so the kv-get fetches it again or answers NoSuchKey."""
        now = time.monotonic()
        stale = [(k, c) for k, c in zip(keys, cids)
                 if self.files.size(c) is not None and now - self.files.confirmed.get(c, -math.inf) >= self.revalidate_after_s]
        if not stale:
            return
        gate = asyncio.Semaphore(self.concurrency)

        async def one(key: str, cid: str) -> None:
            async with gate:
                etag = await self.up.etag(bucket, key, f"/{bucket}/{key}") or ""
            self.revalidated += 1
            if etag and version_tag(etag) == self.files.version(cid):
                self.files.confirmed[cid] = time.monotonic()
            else:
                self.files.drop(cid)  # a transfer holding it keeps its descriptor

        await asyncio.gather(*(one(k, c) for k, c in stale))

    async def pin(self, bucket: str, keys: list[str], pin_for: PinFor | None = None) -> PinnedChunks:
        tenant = pin_for.tenant if pin_for is not None else ""
        cids = await self._ids(bucket, keys)
        await self._revalidate(bucket, keys, cids)
        pinned: list[str] = []
        upstream: list[str] = []
        filled = Filled()
        try:
            hits = [c for c in cids if self.files.size(c) is not None]
            self.files.policy.pin(hits)
            pinned += hits
            hit_set = set(hits)
            missing = [(i, k, c) for i, (k, c) in enumerate(zip(keys, cids)) if c not in hit_set]
            busy = [self._inflight[c] for _, _, c in missing if c in self._inflight]
            if busy and self.second is not None:  # fetched (or landed) for another kv-get: wait for it, not fetch it again
                await asyncio.wait(busy)
                more = {c for _, _, c in missing if self.files.size(c) is not None}
                self.files.policy.pin(list(more))
                pinned += more
                missing = [m for m in missing if m[2] not in more]
            if missing and self.second is not None and pin_for is not None:
                if pin_for.chunk_bytes > 0:  # raw chunks from peers arrive in memory (cut-through), the rest via the cache
                    filled.arrivals, filled.rows = Arrivals.make(len(keys), pin_for.chunk_bytes), [i for i, _, _ in missing]
                try:
                    await self.second.fill(bucket, self._bucket_ids[bucket], [(k, c) for _, k, c in missing], pin_for, self, filled)
                finally:
                    pinned += filled.pinned
                got = set(filled.pinned) | {cids[r] for r in (filled.arrivals.landed if filled.arrivals else ())}
                missing = [m for m in missing if m[2] not in got]
            gate = asyncio.Semaphore(self.concurrency)

            async def one(key: str, cid: str) -> None:
                async with gate:
                    if await self._fetch_pinned(bucket, key, cid, tenant):
                        upstream.append(cid)
                    pinned.append(cid)

            results = await asyncio.gather(*(one(k, c) for _, k, c in missing), return_exceptions=True)
            for (i, key, _), r in zip(missing, results):
                if isinstance(r, S3Error) and r.code == ErrorCode.NoSuchKey:
                    raise S3Error(ErrorCode.NoSuchKey, f"chunk {key!r} is not stored (the first missing key of {len(keys)})", extra={"Key": key})
            for r in results:
                if isinstance(r, BaseException):
                    raise r
            # The whole chain is used; those this kv-get brought in itself are its misses, not reuses (a policy counting
            # them as hits learnt that every fetched chunk is reused at once).
            self.files.policy.touch_chain(cids, set(upstream) | set(filled.brought) | set(filled.claimed))
            in_memory = filled.arrivals.landed if filled.arrivals else {}
            on_disk = [j for j in range(len(keys)) if j not in in_memory]
            sizes = [self.files.size(c) if j not in in_memory else filled.arrivals.row_bytes for j, c in enumerate(cids)]  # type: ignore[union-attr]
            for key, size in zip(keys, sizes):
                if size is None:
                    raise S3Error(ErrorCode.NoSuchKey, f"chunk {key!r} was removed while the request was planned", extra={"Key": key})
            paths = [os.fspath(self.files.path(cids[j], sizes[j])) for j in on_disk]  # type: ignore[arg-type]
            disk_sizes = [sizes[j] for j in on_disk]
            try:
                fds, mapped = await self.open.open_all(paths, disk_sizes)  # type: ignore[arg-type]
            except MissingFile as e:  # dropped by a delete or overwrite through this process meanwhile
                key = keys[on_disk[e.index]]
                raise S3Error(ErrorCode.NoSuchKey, f"chunk {key!r} was removed while the request was planned", extra={"Key": key}) from None
        except BaseException:
            self.files.policy.unpin(pinned)
            if filled.arrivals is not None:
                for cid in filled.claimed:
                    self.release(cid)
                filled.arrivals.let_go()
            raise
        if filled.arrivals is None or not in_memory:
            if filled.arrivals is not None:
                filled.arrivals.let_go()
            result = PinnedChunks.whole_files(fds, sizes, mapped, functools.partial(self._release, paths, fds, pinned))  # type: ignore[arg-type]
        else:
            self.arrived += len(in_memory)
            claimed = set(filled.claimed)
            owed = [Owed(row, cids[row], version, cids[row - 1] if row else None) for row, version in sorted(in_memory.items())
                    if cids[row] in claimed]
            result = await pinned_with_arrivals(self, filled.arrivals, owed, tenant, on_disk, fds, mapped, disk_sizes,
                                                functools.partial(self._release, paths, fds, pinned))
        result.paths, result.failovers = _paths(cids, sizes, upstream, filled), filled.failovers  # type: ignore[arg-type]
        return result

    async def pin_held(self, bucket: str, keys: list[str]) -> PinnedChunks | None:
        """The chunks a kv-put just wrote through this cache, pinned as they are (no chunk fetched or revalidated);
        None where one is not cached (no room at the put, or evicted or dropped since): decoded copies after a kv-put."""
        cids = await self._ids(bucket, keys)
        sizes = [self.files.size(c) for c in cids]
        if None in sizes:
            return None
        self.files.policy.pin(cids)
        paths = [os.fspath(self.files.path(c, s)) for c, s in zip(cids, sizes)]  # type: ignore[arg-type]
        try:
            fds, mapped = await self.open.open_all(paths, sizes)  # type: ignore[arg-type]
        except MissingFile:  # dropped by a delete or overwrite meanwhile
            self.files.policy.unpin(cids)
            return None
        except BaseException:
            self.files.policy.unpin(cids)
            raise
        return PinnedChunks.whole_files(fds, sizes, mapped, functools.partial(self._release, paths, fds, cids))  # type: ignore[arg-type]

    def _release(self, paths: list[str], fds: list[int], pinned: list[str]) -> None:
        self.open.release(paths, fds)
        self.files.policy.unpin(pinned)

    @property
    def mapper(self) -> MappedFiles | None:
        """The mappings of this cache's chunk files (decoded copies share them, so raw chunks and copies gather as one)."""
        return self.open.mapper

    def status(self) -> dict[str, object]:
        return {"chunk_cache": self.files.status() | {"fetched": self.fetches.fetched, "revalidated": self.revalidated,
                                                        "arrived": self.arrived, "arrived_cached": self.arrived_cached},
                "open_file_cache": self.open.status(),
                "upstream_gets": {"lean": self.up.lean.served, "declined": self.up.lean.declined} if self.up.lean else {},
                "cache_tenants": self.tenant_status()}

    def tenant_status(self) -> dict[str, dict[str, int]]:
        return self.files.tenant_status()

    async def close(self) -> None:
        if self._invalidate in self.store.listeners:
            self.store.listeners.remove(self._invalidate)
        self.open.close()


def _paths(cids: list[str], sizes: list[int], upstream: list[str], filled: Filled) -> dict[str, int]:
    """Bytes per path of one pin: each peer's and the upstream's, the rest was in the cache already."""
    size = dict(zip(cids, sizes))
    fetched = dict(filled.paths)
    fetched["upstream"] = fetched.get("upstream", 0) + sum(size[c] for c in set(upstream))
    paths = {"local": sum(sizes) - sum(fetched.values()), **fetched}
    return {path: n for path, n in paths.items() if n}
