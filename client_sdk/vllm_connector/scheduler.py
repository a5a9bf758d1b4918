"""The connector's scheduler half: one batched lookup per new request, load and save plans per step.

It needs nothing of vLLM beyond the objects vLLM hands it (a request with ``request_id`` and
``prompt_token_ids``, the step's ``SchedulerOutput``, the KV cache manager's block ids), so it
imports neither vLLM nor torch.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

from protocol.kv_http import LoadBudget, LookupReply

from .config import request_budget
from .plan import ChunkTransfer, RequestState, chunks_to_save, external_tokens, load_transfer

log = logging.getLogger("objectcache.vllm")


class SchedulerSide:
    """Per-request state: the prompt's chunk keys, what is stored, and a load to hand to the worker.

    ``lookup(keys) -> int`` is ObjectCache's batched lookup (leading keys present);
    ``block_ids(req_id) -> list[int]`` the request's blocks in vLLM's KV cache manager.
    """

    def __init__(self, namespace: str, block_size: int, lookup: Callable[[list[str]], int],
                 block_ids: Callable[[str], list[int]] | None = None, *,
                 lookup_within: Callable[[list[str], LoadBudget], LookupReply] | None = None,
                 chunk_shape: tuple[int, int] | None = None, load_budget_s: float = 0.0,
                 loads: bool = True, saves: bool = True) -> None:
        """``lookup_within``, ``chunk_shape`` (layers, bytes of one chunk's layer) and the deployment's
        ``load_budget_s``: a request under a budget is offered only the prefix the node expects to land in time.
        ``loads`` / ``saves``: vLLM's ``kv_role`` (a ``kv_producer`` never loads, a ``kv_consumer`` never saves)."""
        self.loads, self.saves = loads, saves
        self.namespace = namespace
        self.block_size = block_size
        self.lookup = lookup
        self.block_ids = block_ids
        self.lookup_within = lookup_within
        self.chunk_shape = chunk_shape
        self.load_budget_s = load_budget_s
        self.requests: dict[str, RequestState] = {}
        self._local_tokens: dict[str, int] = {}   # num_computed_tokens vLLM passed with the last hit
        self._live: dict[str, Any] = {}           # vLLM's request objects: their token lists grow as they decode

    def state(self, request: Any) -> RequestState:
        """The request's keys, made once from its prompt and its ``cache_salt`` (vLLM's per-request salt, if any)."""
        st = self.requests.get(request.request_id)
        self._live[request.request_id] = request
        if st is None:
            st = self.requests[request.request_id] = RequestState.for_prompt(
                request.prompt_token_ids or [], self.block_size, self.namespace, getattr(request, "cache_salt", None))
        return st

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        """Tokens ObjectCache holds beyond what vLLM has: one batched lookup of the prompt's chunk keys.

        Loads are synchronous (``False``): the worker streams them layer by layer inside the
        forward pass. An unreachable ObjectCache means no hit (the request computes), never an error.
        """
        st = self.state(request)
        if not self.loads or st.loadable * self.block_size <= num_computed_tokens:
            return 0, False
        budget = self._budget(request, num_computed_tokens)
        try:
            if budget is None:
                hits = usable = self.lookup(st.keys[: st.loadable])
            else:
                # Under a load budget only the prefix the node expects to land in time is a hit; vLLM computes the
                # rest (a partial hit, not all or nothing). The worker still cuts a load that falls behind anyway.
                reply = self.lookup_within(st.keys[: st.loadable], budget)  # type: ignore[misc]
                hits, usable = reply.hits, reply.hits if reply.deliverable is None else reply.deliverable
        except Exception as e:  # noqa: BLE001 — any failure of the cache is a miss
            log.warning("ObjectCache lookup for request %s failed, computing instead: %s", request.request_id, e)
            return 0, False
        if usable < hits:
            log.info("request %s: %d of %d stored chunks land within its load budget; computing the rest", request.request_id, usable, hits)
        st.stored = max(st.stored, hits)
        self._local_tokens[request.request_id] = num_computed_tokens
        return external_tokens(usable, num_computed_tokens, self.block_size), False

    def _budget(self, request: Any, num_computed_tokens: int) -> LoadBudget | None:
        """The question for the node when the request loads under a budget (its own or the deployment's, the tightest)."""
        if self.lookup_within is None or self.chunk_shape is None:
            return None
        try:
            own = request_budget(getattr(request, "kv_transfer_params", None))
        except ValueError:
            own = None  # reported when its load is planned
        seconds = min([b for b in (own, self.load_budget_s) if b], default=None)
        if seconds is None:
            return None
        layers, chunk_layer_bytes = self.chunk_shape
        return LoadBudget(seconds, layers, chunk_layer_bytes, num_computed_tokens // self.block_size)

    def update_state_after_alloc(self, request: Any, block_ids: list[int], num_external_tokens: int) -> None:
        local = self._local_tokens.pop(request.request_id, 0)
        if num_external_tokens <= 0:
            return
        st = self.state(request)
        load = load_transfer(request.request_id, st.keys, block_ids, local, num_external_tokens, self.block_size)
        try:
            budget = request_budget(getattr(request, "kv_transfer_params", None))
        except ValueError as e:
            log.warning("request %s: %s; loading without its budget", request.request_id, e)
            budget = None
        st.load = dataclasses.replace(load, budget_s=budget)

    def build(self, scheduler_output: Any) -> tuple[list[ChunkTransfer], list[ChunkTransfer]]:
        """This step's ``(loads, saves)``: pending loads, and prompt blocks the step completes."""
        loads = []
        for st in self.requests.values():
            if st.load is not None:
                loads.append(st.load)
                st.load = None
        saves: list[ChunkTransfer] = []
        for req_id, computed in self._scheduled(scheduler_output) if self.saves else ():
            st = self.requests.get(req_id)
            if st is None:
                # vLLM asks get_num_new_matched_tokens for every new request first; without its
                # state (and so its cache_salt) the keys are unknown, and a guess could cross salts.
                log.warning("request %s: scheduled before its lookup; not saving it", req_id)
                continue
            after = computed + scheduler_output.num_scheduled_tokens.get(req_id, 0)
            live = self._live.get(req_id)
            if live is not None and not scheduler_output.scheduled_spec_decode_tokens.get(req_id):
                # Decode fills blocks with generated tokens: save them too (a later turn's prompt holds
                # this answer). Not with speculative tokens, which may yet be rejected.
                st.extend(live.all_token_ids, after, self.block_size, self.namespace)
            todo = chunks_to_save(st, after, self.block_size)
            if not todo or self.block_ids is None:
                continue
            blocks = self.block_ids(req_id)
            if len(blocks) < todo.stop:
                log.warning("request %s: %d blocks for %d chunks to save; not saving", req_id, len(blocks), todo.stop)
                continue
            saves.append(ChunkTransfer(req_id, tuple(st.keys[todo.start:todo.stop]), tuple(blocks[todo.start:todo.stop])))
            st.stored = todo.stop
        return loads, saves

    @staticmethod
    def _scheduled(out: Any) -> Iterator[tuple[str, int]]:
        """``(req_id, num_computed_tokens)`` of every request in the step."""
        for new in out.scheduled_new_reqs:
            yield new.req_id, new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            yield req_id, cached.num_computed_tokens[i]

    def request_finished(self, req_id: str) -> None:
        self.requests.pop(req_id, None)
        self._local_tokens.pop(req_id, None)
        self._live.pop(req_id, None)
