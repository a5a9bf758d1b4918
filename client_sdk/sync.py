"""A synchronous facade for serving code that is not async.

It runs an :class:`ObjectCacheClient` on a private event loop thread; every
method blocks until its result is ready. ``fetch_layers`` yields layers in
order as they land, exactly like the async iterator.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from protocol.kv_http import LoadBudget, LookupReply

from .client import ObjectCacheClient
from .layout import KVLayout
from .stream import FetchStats, LayerStream


class SyncLayers:
    def __init__(self, owner: "SyncObjectCacheClient", stream: LayerStream) -> None:
        self._owner, self.stream = owner, stream

    def __iter__(self) -> Iterator[tuple[int, memoryview]]:
        while True:
            try:
                yield self._owner._call(self.stream.__anext__())
            except StopAsyncIteration:
                return

    @property
    def stats(self) -> FetchStats:
        return self.stream.stats

    def layer(self, index: int) -> memoryview:
        return self.stream.layer(index)


class SyncObjectCacheClient:
    def __init__(self, endpoint: str, access_key: str, secret_key: str, bucket: str, region: str = "us-east-1", **options: Any) -> None:
        """``options`` are :class:`ObjectCacheClient`'s (``retries``, ``backoff``, ``read_timeout``, ...)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="objectcache-client", daemon=True)
        self._thread.start()
        self.client = ObjectCacheClient(endpoint, access_key, secret_key, bucket, region, **options)
        self._call(self.client.__aenter__())

    def _call(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def submit(self, coro) -> "asyncio.Future":
        """Run a coroutine on the client's loop without waiting (a concurrent.futures.Future)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def ensure_bucket(self) -> None:
        self._call(self.client.ensure_bucket())

    def put_chunks(self, keys: Sequence[str], chunks: Sequence[Any], layout: KVLayout | None = None, *,
                   codec: str = "none", soft_pin_s: float = 0.0) -> int:
        return self._call(self.client.put_chunks(keys, chunks, layout, codec=codec, soft_pin_s=soft_pin_s))

    def lookup(self, keys: Sequence[str]) -> int:
        return self._call(self.client.lookup(keys))

    def lookup_within(self, keys: Sequence[str], budget: LoadBudget | None = None) -> LookupReply:
        """:meth:`ObjectCacheClient.lookup_within`: ``LookupReply`` with ``deliverable`` under a ``LoadBudget``."""
        return self._call(self.client.lookup_within(keys, budget))

    def fetch(self, keys: Sequence[str], layout: KVLayout, transport: str = "auto", **kw: Any) -> tuple[np.ndarray, FetchStats]:
        return self._call(self.client.fetch(keys, layout, transport, **kw))

    @contextlib.contextmanager
    def fetch_layers(self, keys: Sequence[str], layout: KVLayout, transport: str = "auto", **kw: Any) -> Iterator[SyncLayers]:
        cm = self.client.fetch_layers(keys, layout, transport, **kw)
        stream = self._call(cm.__aenter__())
        try:
            yield SyncLayers(self, stream)
        except BaseException as e:
            self._call(cm.__aexit__(type(e), e, e.__traceback__))
            raise
        else:
            self._call(cm.__aexit__(None, None, None))

    def close(self) -> None:
        if self._loop.is_running():
            self._call(self.client.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def __enter__(self) -> "SyncObjectCacheClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
