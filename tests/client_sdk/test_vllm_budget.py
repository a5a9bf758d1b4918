"""Load budgets: the deployment's (``load_budget_s``) and a request's own (``kv_transfer_params``), pure parts."""

from __future__ import annotations

import pytest

from client_sdk.vllm_connector.config import REQUEST_BUDGET, ConnectorConfig, request_budget
from client_sdk.vllm_connector.plan import ChunkTransfer, load_budget

KEYS = {"endpoint": "http://127.0.0.1:1", "access_key": "a", "secret_key": "b"}


def test_the_deployment_budget_is_a_checked_number_defaulting_to_none():
    assert ConnectorConfig.from_extra(KEYS, {}).load_budget_s == 0.0
    assert ConnectorConfig.from_extra({**KEYS, "load_budget_s": "0.25"}, {}).load_budget_s == 0.25
    for bad in ("soon", -1, float("nan")):
        with pytest.raises(ValueError, match="load_budget_s"):
            ConnectorConfig.from_extra({**KEYS, "load_budget_s": bad}, {})


def test_a_requests_budget_comes_from_its_kv_transfer_params():
    assert request_budget(None) is None and request_budget({}) is None and request_budget({REQUEST_BUDGET: 0}) is None
    assert request_budget({REQUEST_BUDGET: "0.1"}) == 0.1
    with pytest.raises(ValueError, match=REQUEST_BUDGET):
        request_budget({REQUEST_BUDGET: "later"})


def test_a_merged_load_keeps_the_tightest_budget():
    a, b, c = (ChunkTransfer(r, ("k",), (1,), budget) for r, budget in (("a", 0.5), ("b", None), ("c", 0.1)))
    assert load_budget([a, b, c], 0.0) == 0.1
    assert load_budget([b], 0.0) is None
    assert load_budget([b], 2.0) == 2.0 and load_budget([a, b], 0.3) == 0.3


def test_under_a_budget_the_scheduler_offers_only_the_prefix_the_node_says_lands_in_time():
    from types import SimpleNamespace

    from client_sdk.vllm_connector.scheduler import SchedulerSide
    from protocol.kv_http import LoadBudget, LookupReply

    asked: list[tuple[int, LoadBudget | None]] = []

    def lookup(keys):
        asked.append((len(keys), None))
        return len(keys)

    def lookup_within(keys, budget):
        asked.append((len(keys), budget))
        return LookupReply(len(keys), len(keys), 2 + budget.skip)

    side = SchedulerSide("ns", 16, lookup, lookup_within=lookup_within, chunk_shape=(4, 4096), load_budget_s=0.5)
    prompt = list(range(16 * 6 + 1))  # 6 loadable chunks
    request = lambda rid, params: SimpleNamespace(request_id=rid, prompt_token_ids=prompt, kv_transfer_params=params)  # noqa: E731
    assert side.get_num_new_matched_tokens(request("a", None), 0) == (2 * 16, False)   # the deployment's 0.5 s
    assert asked[-1] == (6, LoadBudget(0.5, 4, 4096, 0))
    assert side.get_num_new_matched_tokens(request("b", {REQUEST_BUDGET: 0.1}), 32) == (2 * 16, False)  # 2 held + 2 in time
    assert asked[-1] == (6, LoadBudget(0.1, 4, 4096, 2)), "the tightest budget, and the chunks vLLM holds"
    assert side.requests["a"].stored == 6, "what is stored beyond the prefix is not saved again"
    unbounded = SchedulerSide("ns", 16, lookup, lookup_within=lookup_within, chunk_shape=(4, 4096))
    assert unbounded.get_num_new_matched_tokens(request("c", None), 0) == (6 * 16, False)
    assert asked[-1] == (6, None), "no budget: a plain lookup"
