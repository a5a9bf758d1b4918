"""The local-disk store as a chunk source: chunk files pinned through a shared open-file cache.

Pinning a chunk takes a reference on its open file descriptor (opened once,
kept between transfers; see :mod:`storage_server.store.localdisk.open_files`). A delete
or overwrite of a pinned chunk unlinks its file, but the pinned descriptor
still reads the bytes the transfer was planned with.
"""

from __future__ import annotations

import asyncio
import functools

from protocol.errors import ErrorCode, S3Error
from protocol.kv_http import CHUNK_CONTENT_TYPE

from ..chunk_source import ChunkHandle, ChunkSource, PinnedChunks
from ..object_store import PutSpec
from .open_files import MissingFile, OpenFileCache
from .store import LocalDiskStore

CHUNK_SPEC = PutSpec(content_type=CHUNK_CONTENT_TYPE, immutable=True)


class LocalDiskChunkSource(ChunkSource):
    def __init__(self, store: LocalDiskStore, open_files: int) -> None:
        self.store = store
        self.files = OpenFileCache(open_files)

    async def longest_prefix(self, bucket: str, keys: list[str]) -> int:
        found = await self.store.locate(bucket, keys)
        return next((i for i, loc in enumerate(found) if loc is None), len(found))

    async def put_chunks(self, bucket: str, items: list[tuple[str, memoryview]], owner: str) -> list[str]:
        metas = await self.store.put_many(bucket, [(key, data, CHUNK_SPEC) for key, data in items], owner)
        return [m.etag for m in metas]

    async def pin(self, bucket: str, keys: list[str]) -> PinnedChunks:
        found = await self.store.locate(bucket, keys)
        for key, loc in zip(keys, found):
            if loc is None:
                raise S3Error(ErrorCode.NoSuchKey, f"chunk {key!r} is not stored (the first missing key of {len(keys)})", extra={"Key": key})
        paths = [loc[0] for loc in found]  # type: ignore[index]
        try:
            fds = await asyncio.get_running_loop().run_in_executor(None, self.files.acquire, paths)
        except MissingFile as e:
            key = keys[e.index]
            raise S3Error(ErrorCode.NoSuchKey, f"chunk {key!r} was removed while the request was planned", extra={"Key": key}) from None
        handles = [ChunkHandle(fd, 0, loc[1]) for fd, loc in zip(fds, found)]  # type: ignore[index]
        return PinnedChunks(handles, functools.partial(self.files.release, paths))

    async def housekeeping(self) -> dict[str, int]:
        closed = await asyncio.get_running_loop().run_in_executor(None, self.files.sweep)
        return {"closed_fds_of_deleted_chunks": closed}

    def status(self) -> dict[str, object]:
        return {"open_file_cache": self.files.status()}

    async def close(self) -> None:
        self.files.close()
