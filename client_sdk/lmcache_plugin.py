"""ObjectCache as an LMCache remote-storage plugin (``RemoteConnector``), loaded by configuration.

LMCache configuration (YAML or ``LMCACHE_*``)::

    chunk_size: 256
    local_cpu: true                  # the remote backend stages chunks in LMCache's CPU buffer
    max_local_cpu_size: 5
    remote_serde: naive
    remote_storage_plugins: [objectcache]
    extra_config:
      remote_storage_plugin.objectcache.module_path: client_sdk.lmcache_plugin
      remote_storage_plugin.objectcache.class_name: ObjectCacheRemoteConnector
      remote_storage_plugin.objectcache.endpoint: http://127.0.0.1:9000    # else AWS_ENDPOINT_URL
      remote_storage_plugin.objectcache.bucket: kv-cache
      # access_key / secret_key / region / namespace likewise (else AWS_ACCESS_KEY_ID, ...)

What LMCache gets: ``batched_contains`` / ``batched_async_contains`` are one kv-lookup (leading
keys present); ``batched_put`` is one kv-put batch; ``batched_get`` is one kv-get of all full
chunks (a chunk object per LMCache chunk, immutable like every ObjectCache chunk), with plain S3
GETs for partial chunks. Each object is LMCache's ``RemoteMetadata`` header (shape, dtype, format:
what a partial chunk needs to be read back) followed by the chunk's bytes, like LMCache's own FS
connector writes them. Objects live under ``<namespace>/<LMCache key>`` (namespace ``lmcache`` by
default; LMCache's key already names the model, world size, worker and dtype). The key's tags
(LMCache's per-request ``lmcache.tag.*`` configs, e.g. a salt) are hashed into it, never written
as text: LMCache's own ``to_string`` joins them with ``@`` and ``%`` unescaped, so one tag whose
value holds those characters would name the same object as two other tags.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import os
from typing import Any

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from protocol.errors import ErrorCode, S3Error

from .client import ObjectCacheClient
from .layout import KVLayout
from .vllm_connector.config import ENV

log = logging.getLogger("objectcache.lmcache")

PLUGIN = "objectcache"


def plugin_settings(extra_config: dict[str, Any] | None, plugin_name: str = PLUGIN, environ: dict[str, str] | None = None) -> dict[str, str]:
    """``remote_storage_plugin.<name>.*`` from LMCache's extra_config, the environment for what is missing."""
    extra, env = extra_config or {}, os.environ if environ is None else environ
    prefix = f"remote_storage_plugin.{plugin_name}."
    s = {k[len(prefix):]: str(v) for k, v in extra.items() if k.startswith(prefix)}
    for field, var in ENV.items():
        if not s.get(field) and env.get(var):
            s[field] = env[var]
    missing = [f"{prefix}{f} (or {ENV[f]})" for f in ("endpoint", "access_key", "secret_key") if not s.get(f)]
    if missing:
        raise ValueError(f"LMCache extra_config for ObjectCache is missing {', '.join(missing)}")
    s.setdefault("bucket", "kv-cache")
    s.setdefault("region", "us-east-1")
    s.setdefault("namespace", "lmcache")
    return s


def object_key(namespace: str, key: CacheEngineKey) -> str:
    """``<namespace>/<model>@<world size>@<worker>@<chunk hash>@<dtype>[@<layer>][@tags-<digest>]``.

    Untagged keys are LMCache's own ``to_string``; tags enter as a digest of their exact
    ``(name, value)`` pairs, so distinct tag sets (salts) never share an object.
    """
    if not key.tags:
        return f"{namespace}/{key.to_string()}"
    untagged = dataclasses.replace(key, request_configs=None).to_string()  # a layer key keeps its layer id
    tags = json.dumps(sorted([str(k), str(v)] for k, v in key.tags), separators=(",", ":"))
    return f"{namespace}/{untagged}@tags-{hashlib.sha256(tags.encode()).hexdigest()[:32]}"


class ObjectCacheRemoteConnector(RemoteConnector):
    """LMCache's remote connector interface over ObjectCache's batched KV operations."""

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend: Any, config: Any, plugin_name: str = PLUGIN) -> None:
        super().__init__(local_cpu_backend.config, local_cpu_backend.metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.settings = plugin_settings(config.extra_config if config is not None else None, plugin_name)
        self.namespace = self.settings["namespace"]
        # A full chunk object is header + full chunk: kv-get moves N of them as one "layer" of N·S bytes.
        self.object_bytes = (self.remote_metadata_bytes if self.save_chunk_meta else 0) + self.full_chunk_size_bytes
        self._flat = KVLayout(1, 1, 1, self.object_bytes // 2, "uint8") if self.object_bytes % 2 == 0 else None
        self._client: ObjectCacheClient | None = None
        self._opening: asyncio.Lock | None = None
        log.info("LMCache → ObjectCache at %s, bucket %s, namespace %s", self.settings["endpoint"], self.settings["bucket"], self.namespace)

    async def _c(self) -> ObjectCacheClient:
        """The client, opened on LMCache's event loop (its sessions belong to that loop)."""
        if self._client is None:
            self._opening = self._opening or asyncio.Lock()
            async with self._opening:
                if self._client is None:
                    s = self.settings
                    c = ObjectCacheClient(s["endpoint"], s["access_key"], s["secret_key"], s["bucket"], s["region"])
                    await c.__aenter__()
                    await c.ensure_bucket()
                    self._client = c
        return self._client

    def _key(self, key: CacheEngineKey) -> str:
        return object_key(self.namespace, key)

    # -- lookups ---------------------------------------------------------------------
    async def exists(self, key: CacheEngineKey) -> bool:
        return await (await self._c()).lookup([self._key(key)]) == 1

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return asyncio.run_coroutine_threadsafe(self.exists(key), self.loop).result()

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: list[CacheEngineKey]) -> int:
        """Leading keys present: one kv-lookup (called from outside LMCache's loop)."""
        return asyncio.run_coroutine_threadsafe(self._lookup(keys), self.loop).result()

    async def batched_async_contains(self, lookup_id: str, keys: list[CacheEngineKey], pin: bool = False) -> int:
        return await self._lookup(keys)

    async def _lookup(self, keys: list[CacheEngineKey]) -> int:
        return await (await self._c()).lookup([self._key(k) for k in keys]) if keys else 0

    # -- put -------------------------------------------------------------------------
    def _object(self, memory_obj: MemoryObj) -> list[bytes | memoryview]:
        data = memory_obj.byte_array
        if not self.save_chunk_meta:
            return [data]
        meta = RemoteMetadata(len(data), memory_obj.get_shapes(), memory_obj.get_dtypes(), memory_obj.get_memory_format())
        return [meta.serialize(), data]

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        await self.batched_put([key], [memory_obj])

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: list[CacheEngineKey], memory_objs: list[MemoryObj]) -> None:
        """One kv-put batch. Chunks are immutable: an identical re-put is a no-op, a different one is refused."""
        c = await self._c()
        names = [self._key(k) for k in keys]
        bodies = [b"".join(bytes(p) for p in self._object(m)) for m in memory_objs]
        try:
            await c.put_chunks(names, bodies)
        except S3Error as e:
            if e.code != ErrorCode.InvalidRequest or len(names) == 1:
                raise
            # One chunk stored before with other bytes refuses the batch; store the others.
            for name, body in zip(names, bodies):
                try:
                    await c.put_chunks([name], [body])
                except S3Error as one:
                    if one.code != ErrorCode.InvalidRequest:
                        raise

    # -- get -------------------------------------------------------------------------
    def _memory_obj(self, raw: memoryview) -> MemoryObj | None:
        """A MemoryObj from LMCache's allocator holding one stored object's chunk."""
        if self.save_chunk_meta:
            meta = RemoteMetadata.deserialize(bytes(raw[: self.remote_metadata_bytes]))
            data = raw[self.remote_metadata_bytes :]
            obj = self.local_cpu_backend.allocate(meta.shapes, meta.dtypes, meta.fmt)
        else:
            data = raw
            obj = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
        if obj is None:
            return None  # LMCache's buffer is full: a miss, as LMCache's own connectors report it
        dst = obj.byte_array
        if len(data) > len(dst):
            obj.ref_count_down()
            raise ValueError(f"a stored chunk holds {len(data)} bytes, more than the {len(dst)} LMCache allocated")
        memoryview(dst).cast("B")[: len(data)] = data
        return self.reshape_partial_chunk(obj, len(data)) if not self.save_chunk_meta else obj

    async def get(self, key: CacheEngineKey) -> MemoryObj | None:
        c = await self._c()
        try:
            resp = await c.s3.get_object(Bucket=c.bucket, Key=self._key(key))
        except c.s3.exceptions.NoSuchKey:
            return None
        async with resp["Body"] as body:
            raw = await body.read()
        return self._memory_obj(memoryview(raw))

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        """One kv-get for all keys when they are all full chunks; a key that is missing or partial makes it plain GETs."""
        if not keys:
            return []
        c = await self._c()
        if self._flat is not None:
            try:
                payload, _ = await c.fetch([self._key(k) for k in keys], self._flat, "auto")
                flat = memoryview(payload.reshape(-1))
                return [self._memory_obj(flat[i * self.object_bytes : (i + 1) * self.object_bytes]) for i in range(len(keys))]
            except S3Error as e:
                if e.code not in (ErrorCode.NoSuchKey, ErrorCode.KVChunkSizeMismatch):
                    raise
        return list(await asyncio.gather(*(self.get(k) for k in keys)))

    # -- the rest --------------------------------------------------------------------
    async def list(self) -> list[str]:
        c = await self._c()
        names: list[str] = []
        async for page in c.s3.get_paginator("list_objects_v2").paginate(Bucket=c.bucket, Prefix=self.namespace + "/"):
            names.extend(o["Key"][len(self.namespace) + 1 :] for o in page.get("Contents", []))
        return names

    def remove_sync(self, key: CacheEngineKey) -> bool:
        async def remove() -> None:
            c = await self._c()
            await c.s3.delete_object(Bucket=c.bucket, Key=self._key(key))

        try:
            asyncio.run_coroutine_threadsafe(remove(), self.loop).result()
            return True
        except Exception as e:  # noqa: BLE001 — LMCache expects a bool
            log.warning("removing %s from ObjectCache failed: %s", key.to_string(), e)
            return False

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
