"""The connector's worker half: layer-by-layer loads into vLLM's paged cache, batched saves out of it.

Load: ``start_load`` sends one layer-major kv-get for all of the step's chunks; as each layer
lands, the I/O thread scatters it into the requests' blocks and marks it ready, and
``wait_for_layer`` (called by vLLM's attention before layer ℓ) returns as soon as layer ℓ is in
place, so layer ℓ computes while ℓ+1.. are still moving. A load that fails, or a layer not in
place within ``load_timeout_s`` or by the load's deadline (its budget: the tightest of the
deployment's ``load_budget_s`` and its requests' own), marks the load's blocks failed (vLLM
recomputes them); no byte is scattered after that, so a late layer can never land in blocks vLLM
has given to someone else. The budget also goes to the storage server, which ends the transfer as
soon as it expects a layer to start too late (its queue and pacing tell it), so the load fails
then rather than at the deadline.

Save: ``save_layer`` (after layer ℓ's attention wrote the step's KV) gathers the new full blocks
of layer ℓ into chunk buffers in KV_L2TD order; ``finish_step`` hands them to one batched put on
the I/O thread and returns: the forward pass never waits for the network, and the gathered copy
means vLLM may reuse the blocks at once.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import torch

from protocol.errors import ErrorCode, S3Error

from ..layout import KVLayout
from ..sync import SyncObjectCacheClient
from .blocks import PagedFormat, as_array, chunk_layer_shape, chunk_view, layout_of, scatter_layer
from .plan import ChunkTransfer, first_blocks, load_budget, merge

log = logging.getLogger("objectcache.vllm")


@dataclass
class _Load:
    keys: list[str]
    chunk_index: np.ndarray | None  # None: block i takes chunk i (no key repeats), no gather needed
    block_ids: list[int]
    blocks: np.ndarray
    ready: list[threading.Event]
    landed: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    abandoned: bool = False
    error: BaseException | None = None
    future: Future | None = None
    deadline: float | None = None       # time.monotonic() by which every layer must be in place (a load budget)


@dataclass
class _Save:
    keys: list[str]
    blocks: torch.Tensor
    chunks: torch.Tensor                 # [N, L, *chunk layer]: chunk j is chunks[j] (KV_L2TD, or MLA's [L, T, latent])
    gathered: set[int] = field(default_factory=set)


class WorkerSide:
    def __init__(self, client: SyncObjectCacheClient, block_size: int, transport: str = "auto", load_timeout_s: float = 60.0,
                 mode: str = "auto", load_budget_s: float = 0.0, overlap: str = "auto") -> None:
        self.client = client
        self.overlap = overlap
        self.whole_first = overlap == "whole"  # settled at register for "auto"
        self.load_budget_s = load_budget_s
        self.block_size = block_size
        self.transport = transport
        self.mode = mode
        self.load_timeout_s = load_timeout_s
        self.layer_index: dict[str, int] = {}
        self.views: list[torch.Tensor] = []
        self.arrays: list[np.ndarray] = []
        self.layout: KVLayout | None = None
        self.format = PagedFormat("CPU_ATTN")
        self.dtype: torch.dtype | None = None
        self._load: _Load | None = None
        self._save: _Save | None = None
        self._failed: set[int] = set()
        self._puts: list[Future] = []
        self.stats = {"loaded_chunks": 0, "failed_loads": 0, "saved_chunks": 0, "failed_saves": 0}

    def register(self, kv_caches: dict[str, torch.Tensor], order: list[str], fmt: PagedFormat = PagedFormat("CPU_ATTN")) -> None:
        """Learn the paged KV tensors; ``order`` is the layer names in model order, ``fmt`` the backend's paged format."""
        devices = {t.device.type for t in kv_caches.values()}
        if devices != {"cpu"}:
            # The layouts are verified on CPU tensors; the host → GPU copy (side stream, one event
            # per layer) is not written yet, and a copy on the wrong stream would race attention.
            raise ValueError(f"KV cache on {', '.join(sorted(devices))}: ObjectCache's connector moves KV only for "
                             "KV caches in host memory (vLLM's CPU backend) so far")
        self.format = fmt
        # In host memory the storage server's copy into the region, the scatter into the blocks and the forward all run
        # on the CPU's cores: overlapped, they slowed the forward more than they took (vLLM's OpenMP team waits on its
        # slowest thread), so attention starts once the whole load is in place. Layerwise where the copies are DMA.
        self.whole_first = self.overlap == "whole" or (self.overlap == "auto" and devices == {"cpu"})
        self.layer_index = {name: i for i, name in enumerate(order)}
        self.views = [chunk_view(kv_caches[name], self.block_size, fmt) for name in order]
        self.arrays = [as_array(v) for v in self.views]  # what loads scatter into (see blocks.as_array)
        self.layout = layout_of(self.views, fmt)
        self.dtype = self.views[0].dtype

    # -- load ------------------------------------------------------------------------
    def start_load(self, loads: list[ChunkTransfer]) -> None:
        self._settle_load()
        if not loads or self.layout is None:
            return
        keys, chunk_index, block_ids = merge(loads)
        identity = chunk_index == list(range(len(keys)))
        job = _Load(keys, None if identity else np.array(chunk_index), block_ids, np.array(block_ids),
                    [threading.Event() for _ in range(self.layout.num_layers)])
        budget = load_budget(loads, self.load_budget_s)
        job.deadline = None if budget is None else time.monotonic() + budget
        self._load = job

        def done(f: Future) -> None:
            if f.cancelled() or f.exception() is not None:
                job.error = job.error or (f.exception() if not f.cancelled() else TimeoutError("the load was abandoned"))
            for e in job.ready:  # wake every waiter, on failure too
                e.set()

        job.future = self.client.submit(self._fetch(job))
        job.future.add_done_callback(done)

    async def _fetch(self, job: _Load) -> None:
        assert self.layout is not None and self.dtype is not None
        # The storage server gets what is left of the budget: it cuts the transfer at the first layer it
        # cannot start in time (KVLoadBudgetExceeded), so the failure arrives early, not at the deadline.
        budget = 0.0 if job.deadline is None else max(1e-3, job.deadline - time.monotonic())
        async with self.client.client.fetch_layers(job.keys, self.layout, self.transport, mode=self.mode, load_budget_s=budget) as layers:
            async for layer, view in layers:
                with job.lock:
                    if job.abandoned:
                        return
                    # The chunks' rows are copied once more only when a chunk feeds several blocks.
                    scatter_layer(self.arrays[layer], view, job.blocks, job.chunk_index)
                    job.landed.add(layer)
                job.ready[layer].set()

    def wait_for_layer(self, layer_name: str) -> None:
        job = self._load
        layer = self.layer_index.get(layer_name)
        if job is None or layer is None:
            return
        awaited = len(job.ready) - 1 if self.whole_first else layer  # layers land in order; a failure sets every event
        if not job.ready[awaited].wait(self._wait_s(job)):
            job.error = TimeoutError(f"layer {awaited} was not in place within {self.load_timeout_s} s" if job.deadline is None
                                     else f"layer {awaited} was not in place within the load budget")
        if awaited not in job.landed:  # whole first: one timeout fails the load (not one per layer that had landed)
            self._fail(job)

    def _wait_s(self, job: _Load) -> float:
        """How long one more wait on this load may take: the per-layer timeout, cut at the load's deadline."""
        if job.deadline is None:
            return self.load_timeout_s
        return max(0.0, min(self.load_timeout_s, job.deadline - time.monotonic()))

    def _fail(self, job: _Load) -> None:
        with job.lock:
            if job.abandoned:
                return
            job.abandoned = True
        if job.future is not None:
            job.future.cancel()
        for e in job.ready:
            e.set()
        self._failed.update(job.block_ids)
        self.stats["failed_loads"] += 1
        log.warning("ObjectCache load of %d chunk(s) failed, vLLM recomputes them: %s", len(job.keys), job.error)

    def _settle_load(self) -> None:
        """End the step's load: every layer in place, or its blocks reported failed."""
        job, self._load = self._load, None
        if job is None:
            return
        if job.future is not None and not job.future.done():
            try:
                job.future.result(self._wait_s(job))
            except BaseException as e:  # noqa: BLE001 — reported below as failed blocks
                job.error = job.error or e
        if len(job.landed) < len(job.ready):
            self._fail(job)
        elif not job.abandoned:
            self.stats["loaded_chunks"] += len(job.keys)

    def failed_blocks(self) -> set[int]:
        self._settle_load()
        failed, self._failed = self._failed, set()
        return failed

    # -- save ------------------------------------------------------------------------
    def begin_saves(self, saves: list[ChunkTransfer]) -> None:
        self._save = None
        if not saves or self.layout is None:
            return
        keys, chunk_index, block_ids = merge(saves)
        lay = self.layout
        chunks = torch.empty((len(keys), lay.num_layers, *chunk_layer_shape(lay, self.format)), dtype=self.dtype)
        self._save = _Save(keys, torch.tensor(first_blocks(keys, chunk_index, block_ids)), chunks)

    def save_layer(self, layer_name: str) -> None:
        save = self._save
        layer = self.layer_index.get(layer_name)
        if save is None or layer is None:
            return
        save.chunks[:, layer] = self.views[layer][save.blocks]
        save.gathered.add(layer)

    def finish_step(self) -> None:
        """Hand the step's gathered chunks to one batched put, in the background."""
        save, self._save = self._save, None
        self._puts = [f for f in self._puts if not f.done()]
        if save is None:
            return
        assert self.layout is not None
        if len(save.gathered) != self.layout.num_layers:
            log.warning("only %d of %d layers were gathered for %d chunk(s); not saving them",
                        len(save.gathered), self.layout.num_layers, len(save.keys))
            return
        raw = save.chunks.view(torch.uint8).reshape(len(save.keys), -1).numpy()
        self._puts.append(self.client.submit(self._put(save.keys, raw)))

    async def _put(self, keys: list[str], raw) -> None:
        c = self.client.client
        try:
            await c.put_chunks(keys, list(raw), self.layout)
            self.stats["saved_chunks"] += len(keys)
            return
        except S3Error as e:
            if e.code != ErrorCode.InvalidRequest:
                self.stats["failed_saves"] += len(keys)
                log.warning("ObjectCache put of %d chunk(s) failed; they will be computed again next time: %s", len(keys), e)
                return
        # A batch is stored all or nothing: one chunk another engine stored with other bytes (a
        # different batch shape rounds differently) refuses them all. Store the others one by one.
        for key, chunk in zip(keys, raw):
            try:
                await c.put_chunks([key], [chunk], self.layout)
                self.stats["saved_chunks"] += 1
            except S3Error as e:
                if e.code != ErrorCode.InvalidRequest:
                    self.stats["failed_saves"] += 1
                    log.warning("ObjectCache put of %s failed: %s", key, e)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait for the puts in flight (at shutdown)."""
        for f in self._puts:
            try:
                f.result(timeout)
            except BaseException as e:  # noqa: BLE001 — a lost save is a future miss, not an error
                log.warning("ObjectCache put did not finish: %s", e)
        self._puts.clear()
