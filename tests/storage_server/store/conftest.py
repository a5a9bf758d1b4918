"""Every store implementation, opened fresh for one test: the contract suites run against each.

A factory is an async context that yields ``(object_store, chunk_source)`` over a temporary
directory. ``s3`` is the upstream-S3 store over moto's server (one for the session, reset per test).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from upstream import shared_moto

from protocol.config import load_config
from storage_server.store import ChunkSource, ObjectStore, open_chunk_source, open_object_store


@contextlib.asynccontextmanager
async def local_disk(root: Path) -> AsyncIterator[tuple[ObjectStore, ChunkSource]]:
    config_path = root / "store.toml"
    config_path.write_text(f'[store]\nbackend = "local"\ndata_dir = "{root / "data"}"\n[store.local]\nio_threads = 4\n')
    config = load_config(config_path, env={})
    store = open_object_store(config)
    chunks = open_chunk_source(config, store)
    try:
        yield store, chunks
    finally:
        await chunks.close()
        await store.close()


@contextlib.asynccontextmanager
async def upstream_s3(root: Path) -> AsyncIterator[tuple[ObjectStore, ChunkSource]]:
    moto = shared_moto(Path(tempfile.gettempdir()))
    moto.reset()
    config_path = root / "store.toml"
    config_path.write_text(f'[store]\nbackend = "s3"\ndata_dir = "{root / "data"}"\n{moto.config()}')
    config = load_config(config_path, env={})
    store = open_object_store(config)
    chunks = open_chunk_source(config, store)
    try:
        yield store, chunks
    finally:
        await chunks.close()
        await store.close()


STORES: dict[str, Callable[[Path], contextlib.AbstractAsyncContextManager[tuple[ObjectStore, ChunkSource]]]] = {
    "local": local_disk,
    "s3": upstream_s3,
}


@pytest.fixture(params=sorted(STORES))
def opened(request, tmp_path):
    """``opened(scenario)`` runs ``await scenario(store, chunks)`` against a fresh store of this kind."""

    def run(scenario):
        async def main():
            async with STORES[request.param](tmp_path) as (store, chunks):
                return await scenario(store, chunks)

        return asyncio.run(main())

    return run
