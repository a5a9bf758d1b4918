"""The KV path's view of storage: longest-prefix lookup, batched puts, and pinned chunks to range-read.

The storage server is the one process that owns KV chunk capacity, so every
KV put, lookup and read goes through this interface (the gateway serves plain
S3 through :class:`~storage_server.store.object_store.ObjectStore`). A chunk
source hands the executor *pinned* chunks: open handles it can range-read
into a destination. A pinned chunk is never evicted or deleted from under a
transfer; :meth:`PinnedChunks.release` unpins.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .cache.tenants import TenantLedger
from .mapped_files import MappedFiles, MappedSlot


@dataclass(frozen=True)
class PinFor:
    """Whom a pin serves: the kv-get's tenant (authenticated by the gateway) and request id, and the size every
    chunk must have. A source that asks other nodes for chunks (:mod:`storage_server.cluster`) needs all three."""

    tenant: str
    request_id: str
    chunk_bytes: int
    num_layers: int = 1  # layers per chunk (the path scheduler predicts the first layer's arrival)


class ChunkHandle(NamedTuple):
    """Where one chunk object's bytes can be read: ``size`` bytes of file ``fd`` from ``offset``
    (and, where the file is mapped, the same bytes at ``mapped``): one row of :class:`PinnedChunks`' columns."""

    fd: int
    offset: int
    size: int
    mapped: MappedSlot | None = None


@dataclass
class PinnedChunks:
    """Chunks held for one transfer, in the order they were asked for, as columns (chunk j is
    ``sizes[j]`` bytes of ``fds[j]`` from ``offsets[j]``, mapped at ``mapped[j]`` or None).
    Columns, not a tuple per chunk: pinning 3,584 chunks happens before the first layer. Release exactly once."""

    fds: list[int]
    offsets: list[int]
    sizes: list[int]
    mapped: list[MappedSlot | None]
    _unpin: Callable[[], None] | None = field(default=None, repr=False)
    # Where the chunk bytes came from for this pin: "local" (the cache held them), "upstream", "peer:<node id>".
    paths: dict[str, int] = field(default_factory=dict)
    # Peer streams that failed part-way (or sent bad bytes) and whose chunks came another way.
    failovers: int = 0
    # What a reader derives from these very pins and may keep for the next transfer of the same resolved
    # prefix (the executor's row indices); a fresh dict where the pins are not reused.
    derived: dict = field(default_factory=dict, repr=False)

    @classmethod
    def whole_files(cls, fds: list[int], sizes: list[int], mapped: list[MappedSlot | None] | None = None,
                    unpin: Callable[[], None] | None = None) -> "PinnedChunks":
        """Chunks that are each a whole file."""
        return cls(fds, [0] * len(fds), sizes, mapped if mapped is not None else [None] * len(fds), unpin)

    @property
    def handles(self) -> list[ChunkHandle]:
        return [ChunkHandle(*h) for h in zip(self.fds, self.offsets, self.sizes, self.mapped)]

    def release(self) -> None:
        unpin, self._unpin = self._unpin, None
        if unpin is not None:
            unpin()


class ChunkSource(abc.ABC):
    """Immutable KV chunk objects of one store, as the descriptor executor needs them."""

    ledger: TenantLedger | None = None  # per-tenant bounds and counts of the chunks this node keeps

    @property
    def record_s(self) -> float | None:
        """What every pin spends reading records from a remote store before it touches a chunk, as measured (None: not
        measured yet); the delivery-time oracle's prior for a pin of cached chunks. 0 for a store whose records are local."""
        return 0.0

    @property
    def mapper(self) -> MappedFiles | None:
        """Where this store maps its chunk files (None: it maps none); the node's decoded copies map theirs there too,
        so raw chunks and copies of one prefix gather from one arena. Closed after the KV service."""
        return None

    @abc.abstractmethod
    async def longest_prefix(self, bucket: str, keys: list[str]) -> int:
        """How many leading ``keys`` are stored (NoSuchBucket if the bucket is missing)."""

    @abc.abstractmethod
    async def put_chunks(self, bucket: str, items: list[tuple[str, memoryview]], owner: str, soft_pin_s: float = 0.0) -> list[str]:
        """Store immutable chunks durably (an identical re-put is a no-op, different bytes are refused); their ETags.
        ``soft_pin_s`` > 0: also keep them cached that long (``cache.soft_pin_*``; refused beyond the tenant's bound)."""

    @abc.abstractmethod
    async def pin(self, bucket: str, keys: list[str], pin_for: PinFor | None = None) -> PinnedChunks:
        """Pin every key's chunk for reading, all or none (chunks fetched for it count as ``pin_for.tenant``'s);
        NoSuchKey names the first missing key."""

    async def incarnation(self, bucket: str, ask: Callable[[str], Awaitable[str]]) -> str:
        """The bucket's current incarnation (NoSuchBucket if there is none); ``ask`` asks the store. A source that can
        tell when the store's metadata changed remembers the answer until it does."""
        return await ask(bucket)

    def decode_while_fetching(self, decoder: Callable[..., Any]) -> int:
        """Hand the store the decoder that makes a compressed chunk's decoded copy while the chunk streams in from
        elsewhere (a capacity tier's upstream); a store that fetches nothing keeps none. The chunks one pin may decode
        at once (each holds two descriptors meanwhile: the chunk as written, its copy); 0 here."""
        return 0

    async def pin_held(self, bucket: str, keys: list[str]) -> PinnedChunks | None:
        """Pin chunks this node holds, asking nobody for a chunk (none fetched, none revalidated); None where this source
        cannot (then nothing is pinned). For background work on chunks just stored (decoded copies after a kv-put)."""
        return None

    def looked_up(self, tenant: str, found: int, asked: int) -> None:
        """A kv-lookup of ``tenant`` found ``found`` of ``asked`` leading chunks (per-tenant hit counts)."""
        if self.ledger is not None:
            self.ledger.looked_up(tenant, found, asked)

    async def housekeeping(self) -> dict[str, int]:
        """Periodic clean-up (idle handles of deleted chunks, …); returns counts worth logging."""
        return {}

    def status(self) -> dict[str, object]:
        return {}

    def tenant_status(self) -> dict[str, dict[str, int]]:
        """Per tenant: chunk bytes held, its bound, hits, misses, evictions, eviction-to-reuse gap (see ``TenantLedger``)."""
        return {}

    async def close(self) -> None:
        """Release every handle (pinned chunks must have been released)."""
