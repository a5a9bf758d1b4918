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
