"""Open the configured store: ``store.backend`` selects the implementation.

The gateway opens only the object store (plain S3); the storage server opens
both, the chunk source on top of the object store it owns.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from dataclasses import dataclass

from protocol.config import Config, ConfigError

from .cache.soft_pins import SoftPinLimits
from .cache.tenants import TenantQuotas
from .chunk_source import ChunkSource
from .object_store import ObjectStore


@dataclass(frozen=True)
class Backend:
    """How to open one kind of store."""

    object_store: Callable[[Config], ObjectStore]
    chunk_source: Callable[[Config, ObjectStore], ChunkSource]


def _local_store(config: Config) -> ObjectStore:
    from .localdisk import LocalDiskStore

    return LocalDiskStore(config.data_dir, io_threads=config.store.local.io_threads)


def _local_chunks(config: Config, store: ObjectStore) -> ChunkSource:
    from .localdisk import LocalDiskChunkSource, LocalDiskStore

    assert isinstance(store, LocalDiskStore)
    # Chunk files kept open between transfers, bounded by half the process's file limit.
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2
    return LocalDiskChunkSource(store, min(config.storage_server.open_files, limit), config.cache.max_bytes,
                                config.cache.policy, TenantQuotas.from_config(config),
                                SoftPinLimits(config.cache.soft_pin_tenant_max_bytes, config.cache.soft_pin_max_ttl_s))


def _s3_store(config: Config) -> ObjectStore:
    from .s3.store import S3Store

    return S3Store(config.store.s3)


def _s3_chunks(config: Config, store: ObjectStore) -> ChunkSource:
    from .s3.chunks import S3ChunkSource
    from .s3.store import S3Store

    assert isinstance(store, S3Store)
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2  # as the local store: half the process's file limit
    return S3ChunkSource(store, config.data_dir / "chunk-cache", config.cache.max_bytes, config.cache.fetch_concurrency,
                         config.cache.revalidate_after_s, config.cache.policy, TenantQuotas.from_config(config),
                         min(config.storage_server.open_files, limit))


BACKENDS: dict[str, Backend] = {"local": Backend(_local_store, _local_chunks), "s3": Backend(_s3_store, _s3_chunks)}


def _backend(config: Config) -> Backend:
    try:
        return BACKENDS[config.store.backend]
    except KeyError:
        raise ConfigError(f"store.backend: unknown backend {config.store.backend!r} (supported: {', '.join(BACKENDS)})") from None


def open_object_store(config: Config) -> ObjectStore:
    return _backend(config).object_store(config)


def open_chunk_source(config: Config, store: ObjectStore) -> ChunkSource:
    return _backend(config).chunk_source(config, store)
