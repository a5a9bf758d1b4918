"""An engine adapter shaped like vLLM's KV-connector worker side, over numpy buffers.

Loading: ``start_load_kv`` starts the layer-major fetch in the background and
returns at once; ``wait_for_layer_load(ℓ)`` blocks only until layer ℓ has
landed, so the engine computes layer ℓ while ℓ+1.. are still moving.

Saving: ``save_kv_layer(ℓ, kv)`` is called as each layer's KV is produced;
``wait_for_save`` turns the collected layers into KV_L2TD chunk objects and
stores them in one batched put.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from .layout import KVLayout
from .sync import SyncObjectCacheClient


class ObjectCacheKVConnector:
    def __init__(self, client: SyncObjectCacheClient, layout: KVLayout, transport: str = "auto") -> None:
        self.client = client
        self.layout = layout
        self.transport = transport
        self._ready: list[threading.Event] = []
        self._kv: list[np.ndarray] = []
        self._load = None
        self._save_keys: list[str] = []
        self._save_layers: dict[int, np.ndarray] = {}

    # -- load --------------------------------------------------------------------
    def layer_shape(self, num_chunks: int) -> tuple[int, ...]:
        lay = self.layout
        return (num_chunks, 2, lay.chunk_tokens, lay.kv_heads, lay.head_dim)

    def start_load_kv(self, keys: Sequence[str], kv_caches: list[np.ndarray] | None = None, compute_window: float | None = None) -> None:
        """Begin loading ``keys`` into ``kv_caches[ℓ]`` (one array per layer, shape ``layer_shape(N)``)."""
        n = len(keys)
        shape = self.layer_shape(n)
        self._kv = kv_caches if kv_caches is not None else [np.empty(shape, self.layout.numpy_dtype) for _ in range(self.layout.num_layers)]
        for ℓ, buf in enumerate(self._kv):
            if buf.nbytes != n * self.layout.per_layer_chunk_bytes or not buf.flags.c_contiguous:
                raise ValueError(f"kv_caches[{ℓ}] must be a contiguous array of {n * self.layout.per_layer_chunk_bytes} bytes")
        self._ready = [threading.Event() for _ in range(self.layout.num_layers)]
        ready, kv = self._ready, self._kv

        async def load() -> None:
            async with self.client.client.fetch_layers(list(keys), self.layout, self.transport, compute_window=compute_window) as layers:
                async for ℓ, view in layers:
                    kv[ℓ].reshape(-1).view(np.uint8)[:] = np.frombuffer(view, np.uint8)
                    ready[ℓ].set()

        self._load = self.client.submit(load())
        self._load.add_done_callback(lambda f: [e.set() for e in ready])  # wake waiters on failure too

    def wait_for_layer_load(self, layer: int) -> np.ndarray:
        """Block until layer ``layer`` is in place; re-raises a failed load."""
        if self._load is None:
            raise RuntimeError("start_load_kv was not called")
        self._ready[layer].wait()
        if self._load.done() and self._load.exception() is not None:
            raise self._load.exception()  # type: ignore[misc]
        return self._kv[layer]

    def wait_for_load(self) -> None:
        if self._load is not None:
            self._load.result()

    # -- save --------------------------------------------------------------------
    def save_kv_layer(self, layer: int, kv_layer: np.ndarray, keys: Sequence[str] | None = None) -> None:
        """Collect layer ``layer`` of the chunks to save (shape ``layer_shape(N)``)."""
        if keys is not None:
            self._save_keys = list(keys)
        expected = len(self._save_keys) * self.layout.per_layer_chunk_bytes
        if kv_layer.nbytes != expected:
            raise ValueError(f"layer {layer}: {kv_layer.nbytes} bytes, expected {expected} for {len(self._save_keys)} chunks")
        self._save_layers[layer] = np.ascontiguousarray(kv_layer)

    def wait_for_save(self) -> int:
        """Assemble KV_L2TD chunk objects from the saved layers and store them."""
        lay = self.layout
        missing = [ℓ for ℓ in range(lay.num_layers) if ℓ not in self._save_layers]
        if missing:
            raise RuntimeError(f"save_kv_layer was not called for layers {missing[:5]}")
        n, s = len(self._save_keys), lay.per_layer_chunk_bytes
        stacked = np.stack([self._save_layers[ℓ].reshape(-1).view(np.uint8).reshape(n, s) for ℓ in range(lay.num_layers)])
        chunks = np.ascontiguousarray(stacked.transpose(1, 0, 2)).reshape(n, lay.chunk_bytes)
        stored = self.client.put_chunks(self._save_keys, list(chunks), lay)
        self._save_layers.clear()
        return stored
