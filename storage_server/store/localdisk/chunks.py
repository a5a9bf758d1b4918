"""The local-disk store as a chunk source: chunk files pinned through a shared open-file cache, bounded by ``cache.max_bytes``.

Pinning a chunk takes a reference on its open file descriptor (opened once,
kept between transfers, and mapped; see :mod:`storage_server.store.open_files`). A delete
or overwrite of a pinned chunk unlinks its file, but the pinned descriptor
still reads the bytes the transfer was planned with.

KV chunk objects (immutable, written by kv-put) are capacity the node may give back:
above ``max_bytes`` of them, unpinned ones are deleted in the order ``cache.policy`` says
(:mod:`storage_server.store.cache.policy`; always the tail of a prefix before its head).
Plain user objects are never evicted and never counted. An entry names the exact
version the bound admitted (bucket, key and the file of those bytes): eviction deletes
a row only while it is still that immutable chunk, so a chunk deleted through the gateway
and replaced by a plain object, or a bucket deleted and recreated (by any tenant) with
an object under the same key, is never touched. The policy starts from the index (oldest
written first); chunks deleted through the gateway are forgotten at the next restart,
until then they only make the bound stricter.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable

from protocol.errors import ErrorCode, S3Error
from protocol.kv_http import CHUNK_CONTENT_TYPE

from ..cache.deferred_touches import DeferredTouches
from ..cache.policy import make_policy
from ..cache.soft_pins import SoftPinLimits, SoftPinRefused, SoftPins
from ..cache.tenants import TenantLedger, TenantQuotas
from ..chunk_source import ChunkSource, PinFor, PinnedChunks
from ..mapped_files import MappedFiles
from ..object_store import PutSpec
from ..open_files import MissingFile, OpenFileCache
from .locations import Location, LocationCache
from .resolved import Resolved, ResolvedPrefixes
from .store import LocalDiskStore

CHUNK_SPEC = PutSpec(content_type=CHUNK_CONTENT_TYPE, immutable=True)


def _name(bucket: str, key: str, path: str) -> str:
    """One admitted chunk version: its bucket, its key and the file of its bytes (unique per write)."""
    return f"{bucket}\0{key}\0{path}"


def _version(name: str) -> tuple[str, str, str]:
    bucket, rest = name.split("\0", 1)
    key, path = rest.rsplit("\0", 1)  # a key may hold NUL; a bucket name and a path never do
    return bucket, key, path


class LocalDiskChunkSource(ChunkSource):
    def __init__(self, store: LocalDiskStore, open_files: int, max_bytes: int, policy: str = "reuse",
                 quotas: TenantQuotas | None = None, soft_pins: SoftPinLimits | None = None) -> None:
        self.store = store
        # Cached files are also mapped (a layer is then gathered in one copy); not when nothing is cached.
        self.files = OpenFileCache(open_files, MappedFiles(2 * open_files) if open_files else None)
        self.max_bytes = max_bytes
        self.policy = DeferredTouches(make_policy(policy))  # a kv-get's touch waits for the next decision
        self.ledger = TenantLedger(quotas or TenantQuotas(max_bytes))
        self.soft = SoftPins(soft_pins or SoftPinLimits())
        self._soft_names: dict[str, str] = {}  # soft-pinned "bucket\0key" -> the policy name of the version it pins
        for bucket, key, path, size, owner in store.index.chunk_objects():
            self.policy.add(_name(bucket, key, path), size, None, owner)
            self.ledger.seen(owner)
        self.evicted = 0
        self._trimming: asyncio.Task | None = None
        self.locations = LocationCache(store.index.db_path)
        self.resolved = ResolvedPrefixes(self.files, self._let_go)  # repeated prefixes: pinned in O(1)

    async def incarnation(self, bucket: str, ask: Callable[[str], Awaitable[str]]) -> str:
        """Remembered while the metadata database is unchanged (any commit by anyone forgets it: ``LocationCache``)."""
        known = self.locations.incarnation(bucket)
        if known is None:
            version = self.locations.seen
            known = await ask(bucket)
            self.locations.put_incarnation(bucket, known, version)
        return known

    async def _locate(self, bucket: str, keys: list[str]) -> list[Location | None]:
        """Each key's (file, size), or None: remembered while the metadata is unchanged, else asked of the index."""
        found: list[Location | None] | None = self.locations.get(bucket, keys)  # type: ignore[assignment]
        if found is None:
            version = self.locations.seen
            found = await self.store.locate(bucket, keys)
            self.locations.put(bucket, keys, found, version)
        return found

    async def longest_prefix(self, bucket: str, keys: list[str]) -> int:
        found = await self._locate(bucket, keys)
        return next((i for i, loc in enumerate(found) if loc is None), len(found))

    async def put_chunks(self, bucket: str, items: list[tuple[str, memoryview]], owner: str, soft_pin_s: float = 0.0) -> list[str]:
        if soft_pin_s:
            try:
                self.soft.check(owner, [(f"{bucket}\0{key}", data.nbytes) for key, data in items], soft_pin_s)
            except SoftPinRefused as e:
                raise S3Error(ErrorCode.InvalidRequest, str(e)) from None
        metas = await self.store.put_many(bucket, [(key, data, CHUNK_SPEC) for key, data in items], owner)
        self.policy.add_chain([(_name(bucket, m.key, m.locator), m.size) for m in metas], None, owner)
        for m in metas:
            self.ledger.stored(owner, f"{bucket}\0{m.key}", m.size)
        if soft_pin_s:
            self._soft_pin(bucket, metas, owner, soft_pin_s)
        await self._trim()
        return [m.etag for m in metas]

    def _soft_pin(self, bucket: str, metas: list, owner: str, ttl_s: float) -> None:
        """Hold the stored versions in the policy (one pin each) until the TTL ends; a re-put moves the pin to its new version."""
        logical = [(f"{bucket}\0{m.key}", m.size) for m in metas]
        try:
            self.soft.mark(owner, logical, ttl_s, time.monotonic())
        except SoftPinRefused as e:  # a concurrent put took the bound since the check
            raise S3Error(ErrorCode.InvalidRequest, f"chunks stored but not soft-pinned: {e}") from None
        for (lkey, _), m in zip(logical, metas):
            name = _name(bucket, m.key, m.locator)
            old = self._soft_names.get(lkey)
            if old != name:
                self.policy.pin([name])
                if old is not None:
                    self.policy.unpin([old])
                self._soft_names[lkey] = name

    def _expire_soft_pins(self) -> None:
        for lkey in self.soft.expired(time.monotonic()):
            name = self._soft_names.pop(lkey, None)
            if name is not None:
                self.policy.unpin([name])

    async def _trim(self) -> None:
        """Delete unpinned chunks the policy picks: a tenant's own beyond its bound, then any until within ``max_bytes``
        (or only pinned ones are left)."""
        self._expire_soft_pins()
        chosen: list[str] = []
        for tenant in self.ledger.tenants():
            over = self.ledger.over(tenant, self.policy.tenant_used(tenant))
            if over:
                self.resolved.drop_idle()
                chosen += self._take(self.policy.victims(over, partial=True, tenant=tenant) or [])
        need = self.policy.used - self.max_bytes
        if need > 0:
            if self.resolved.drop_idle():  # their chunks were pinned only for the next repeat: eviction comes first
                need = self.policy.used - self.max_bytes
            chosen += self._take(self.policy.victims(need, partial=True) or [])
        if not chosen:
            return
        by_bucket: dict[str, list[tuple[str, str]]] = {}
        for name in chosen:
            bucket, key, path = _version(name)
            by_bucket.setdefault(bucket, []).append((key, path))
        for bucket, versions in by_bucket.items():
            self.evicted += await self.store.evict_chunks(bucket, versions)

    def _take(self, names: list[str]) -> list[str]:
        """Forget the victims ``names`` (counted per tenant); they are deleted next."""
        for name in names:
            tenant = self.policy.tenant_of(name)
            size = self.policy.remove(name)
            bucket, key, _ = _version(name)
            self.ledger.evicted(tenant, f"{bucket}\0{key}", size)
        return names

    async def pin(self, bucket: str, keys: list[str], pin_for: PinFor | None = None) -> PinnedChunks:
        version = self.locations.version()
        entry = self.resolved.get(bucket, keys, version)
        if entry is not None:  # the same prefix, nothing committed since: no per-key work
            return self.resolved.pinned(entry, functools.partial(self._release_resolved, entry))
        found = await self._locate(bucket, keys)
        for key, loc in zip(keys, found):
            if loc is None:
                raise S3Error(ErrorCode.NoSuchKey, f"chunk {key!r} is not stored (the first missing key of {len(keys)})", extra={"Key": key})
        paths = [loc[0] for loc in found]  # type: ignore[index]
        names = [_name(bucket, k, p) for k, p in zip(keys, paths)]
        self.policy.pin(names)  # before the first await: an eviction running meanwhile skips them
        sizes = [loc[1] for loc in found]  # type: ignore[index]
        try:
            fds, mapped = await self.files.open_all(paths, sizes)
        except MissingFile as e:
            self.policy.unpin(names)
            key = keys[e.index]
            raise S3Error(ErrorCode.NoSuchKey, f"chunk {key!r} was removed while the request was planned", extra={"Key": key}) from None
        except BaseException:
            self.policy.unpin(names)
            raise
        entry = Resolved(bucket, keys, paths, names, sizes, fds, mapped)
        if self.resolved.add(entry, version):  # the entry holds these pins from now on
            return self.resolved.pinned(entry, functools.partial(self._release_resolved, entry))
        return PinnedChunks.whole_files(fds, sizes, mapped, functools.partial(self._release, paths, names))

    async def pin_held(self, bucket: str, keys: list[str]) -> PinnedChunks | None:
        """Every chunk of a local store is held here: an ordinary pin (None if one went meanwhile)."""
        try:
            return await self.pin(bucket, keys)
        except S3Error as e:
            if e.code == ErrorCode.NoSuchKey:
                return None
            raise

    def _release_resolved(self, entry: Resolved) -> None:
        """A transfer of a kept prefix ended: its chunks become the most recently used; the entry keeps them pinned."""
        self.policy.touch_chain(entry.names)
        self.resolved.done(entry)

    def _let_go(self, entry: Resolved) -> None:
        """A kept prefix left the cache and no transfer reads it: unpin its chunks (eviction may take them again)."""
        self.files.release(entry.paths)
        self.policy.unpin(entry.names)

    def _release(self, paths: list[str], names: list[str]) -> None:
        """The transfer is over: its chunks become the most recently used (off the first layer's path), unpinned."""
        self.files.release(paths)
        self.policy.touch_chain(names)
        self.policy.unpin(names)
        if self.policy.used > self.max_bytes and (self._trimming is None or self._trimming.done()):
            try:
                self._trimming = asyncio.get_running_loop().create_task(self._trim())
            except RuntimeError:
                pass  # released off the loop: the next put trims

    async def housekeeping(self) -> dict[str, int]:
        self.resolved.check(self.locations.version())  # metadata changed with no kv-get since: let the kept pins go
        closed = await asyncio.get_running_loop().run_in_executor(None, self.files.sweep)
        await self._trim()
        return {"closed_fds_of_deleted_chunks": closed}

    @property
    def mapper(self) -> MappedFiles | None:
        return self.files.mapper

    def status(self) -> dict[str, object]:
        kept = self.resolved.kept_files()
        return {"open_file_cache": self.files.status(kept) | {"kept_for_repeats": len(kept)}, "chunk_locations": self.locations.status(),
                "resolved_prefixes": self.resolved.status(),
                "chunk_bytes": {"bytes": self.policy.used, "max_bytes": self.max_bytes, "chunks": len(self.policy),
                                "pinned_bytes": self.policy.pinned_bytes, "evicted": self.evicted},
                "soft_pinned_bytes": self.soft.status(),
                "cache_tenants": self.tenant_status()}

    def tenant_status(self) -> dict[str, dict[str, int]]:
        return self.ledger.status({t: self.policy.tenant_used(t) for t in self.ledger.tenants()})

    async def close(self) -> None:
        if self._trimming is not None:
            await asyncio.gather(self._trimming, return_exceptions=True)
        self.resolved.clear()
        self.files.close()
        self.locations.close()
