"""``ObjectCacheConnector``: the class vLLM loads (``kv_connector_module_path="client_sdk.vllm_connector"``).

It wires vLLM's ``KVConnectorBase_V1`` calls to :class:`~.scheduler.SchedulerSide` (in the
scheduler) or :class:`~.worker.WorkerSide` (in each worker); the metadata that crosses from one
to the other each step is a list of loads and a list of saves (chunk keys ↔ block ids).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole

from ..sync import SyncObjectCacheClient
from .blocks import PagedFormat
from .config import ConnectorConfig, namespace
from .groups import check_kv_cache_groups
from .plan import ChunkTransfer
from .scheduler import SchedulerSide
from .worker import WorkerSide

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = logging.getLogger("objectcache.vllm")


@dataclass
class ObjectCacheConnectorMetadata(KVConnectorMetadata):
    loads: list[ChunkTransfer] = field(default_factory=list)
    saves: list[ChunkTransfer] = field(default_factory=list)


def _kv_dtype(vllm_config: "VllmConfig") -> str:
    cache_dtype = vllm_config.cache_config.cache_dtype
    return str(vllm_config.model_config.dtype if cache_dtype == "auto" else cache_dtype).removeprefix("torch.")


def _layer_order(names: list[str]) -> list[str]:
    """Layer names in model order (by their layer index; dict order where there is none)."""
    from vllm.model_executor.models.utils import extract_layer_index

    try:
        return sorted(names, key=extract_layer_index)
    except (AssertionError, ValueError):
        return list(names)


def _paged_format(vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig | None", names: list[str]) -> PagedFormat:
    """The layers' paged format, from vLLM itself: each layer's attention backend and the resolved KV cache layout."""
    context = vllm_config.compilation_config.static_forward_context
    backends = {context[n].get_attn_backend().get_name() for n in names if n in context}
    if len(backends) != 1:
        raise ValueError(f"ObjectCache's connector needs one attention backend for all KV layers, got {sorted(backends) or 'none'}")
    layout = getattr(kv_cache_config, "kv_cache_layout", None)
    if layout is None:
        layout = vllm_config.cache_config.get_resolved_kv_cache_layout()
    return PagedFormat(backends.pop(), getattr(layout, "name", str(layout)))


def _chunk_shape(kv_cache_config: "KVCacheConfig | None") -> tuple[int, int] | None:
    """(layers, bytes of one block of one layer) of the one KV cache group: what a load moves per chunk, for budgets."""
    if kv_cache_config is None or len(kv_cache_config.kv_cache_groups) != 1:
        return None
    group = kv_cache_config.kv_cache_groups[0]
    spec = group.kv_cache_spec
    return len(group.layer_names), int(getattr(spec, "real_page_size_bytes", spec.page_size_bytes))


class ObjectCacheConnector(KVConnectorBase_V1):
    """Prefix KV cache in ObjectCache, loaded layer by layer inside vLLM's forward pass."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig | None" = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        if kv_cache_config is not None:
            check_kv_cache_groups(kv_cache_config.kv_cache_groups)
        self.config = ConnectorConfig.from_extra(self._kv_transfer_config.kv_connector_extra_config or {})
        self.block_size = vllm_config.cache_config.block_size
        parallel = vllm_config.parallel_config
        model, dtype = vllm_config.model_config.model, _kv_dtype(vllm_config)
        # Everything that changes KV bytes is in the namespace (the request's cache_salt goes into the hash).
        identity = {"revision": vllm_config.model_config.revision, "block_size": self.block_size,
                    "layout": "mla" if vllm_config.model_config.use_mla else "kv"}
        c = self.config
        self.client = SyncObjectCacheClient(c.endpoint, c.access_key, c.secret_key, c.bucket, c.region)
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            # Lookups use rank 0's keys: every rank stores the same chunks of its own shard. A rank
            # whose chunk is missing after all fails its load, and vLLM recomputes.
            self.namespace = namespace(c, model, dtype, 0, parallel.tensor_parallel_size, 0, parallel.pipeline_parallel_size, **identity)
            try:
                self.client.ensure_bucket()
            except Exception as e:  # noqa: BLE001 — an unreachable cache at start-up is a miss, not a crash
                log.warning("ObjectCache bucket %r could not be checked or created at %s: %s", c.bucket, c.endpoint, e)
            self._scheduler = SchedulerSide(self.namespace, self.block_size, self.client.lookup, self._block_ids,
                                            lookup_within=self.client.lookup_within, chunk_shape=_chunk_shape(kv_cache_config),
                                            load_budget_s=c.load_budget_s, loads=self._kv_transfer_config.is_kv_consumer,
                                            saves=self._kv_transfer_config.is_kv_producer)
        else:
            from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

            self.namespace = namespace(c, model, dtype, get_tensor_model_parallel_rank(), parallel.tensor_parallel_size,
                                       get_pp_group().rank_in_group, parallel.pipeline_parallel_size, **identity)
            self._worker = WorkerSide(self.client, self.block_size, c.transport, c.load_timeout_s, c.mode, c.load_budget_s, c.overlap)
        log.info("ObjectCache connector (%s): %s bucket %s, namespace %s, transport %s", role.name.lower(), c.endpoint, c.bucket,
                 self.namespace, c.transport)

    @property
    def stats(self) -> dict[str, int]:
        """This worker's counts: ``loaded_chunks``, ``failed_loads``, ``saved_chunks``, ``failed_saves`` (empty in the scheduler)."""
        return dict(self._worker.stats) if self._worker is not None else {}

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a best-effort cache: a dropped save is a future miss

    # -- scheduler side --------------------------------------------------------------
    def _block_ids(self, req_id: str) -> list[int]:
        assert self._kv_cache_manager is not None, "vLLM did not bind its KV cache manager"
        return list(self._kv_cache_manager.get_block_ids(req_id)[0])

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:
        assert self._scheduler is not None
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int) -> None:
        assert self._scheduler is not None
        block_ids = blocks.get_block_ids()[0] if num_external_tokens > 0 else []
        self._scheduler.update_state_after_alloc(request, list(block_ids), num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        assert self._scheduler is not None
        loads, saves = self._scheduler.build(scheduler_output)
        return ObjectCacheConnectorMetadata(loads, saves)

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        if self._scheduler is not None:
            self._scheduler.request_finished(request.request_id)
        return False, None  # saves copy their blocks out during the forward pass: free them now

    # -- worker side -----------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        fmt = _paged_format(self._vllm_config, self._kv_cache_config, list(kv_caches))
        if fmt.namespace_layout not in self.namespace.split("/"):
            raise ValueError(f"{fmt.backend} stores {fmt.namespace_layout} chunks but the namespace {self.namespace!r} says otherwise")
        self._worker.register(kv_caches, _layer_order(list(kv_caches)), fmt)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None and isinstance(connector_metadata, ObjectCacheConnectorMetadata):
            # save_kv_layer may run before start_load_kv (vLLM starts loads after the forward in steps without sync loads).
            self._worker.begin_saves(connector_metadata.saves)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        assert self._worker is not None
        meta = self._get_connector_metadata()
        assert isinstance(meta, ObjectCacheConnectorMetadata)
        self._worker.start_load(meta.loads)

    def wait_for_layer_load(self, layer_name: str) -> None:
        assert self._worker is not None
        self._worker.wait_for_layer(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: "AttentionMetadata", **kwargs: Any) -> None:
        assert self._worker is not None
        self._worker.save_layer(layer_name)

    def wait_for_save(self) -> None:
        assert self._worker is not None
        self._worker.finish_step()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return None, None  # loads finish inside their step; saves never hold blocks

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.failed_blocks() if self._worker is not None else set()

    def flush_saves(self, timeout: float = 30.0) -> None:
        """Wait for this worker's background saves (a benchmark keeps them out of its next timed request)."""
        if self._worker is not None:
            self._worker.flush(timeout)

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.flush()
        self.client.close()
