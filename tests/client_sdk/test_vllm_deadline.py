"""Loads bounded by a deadline: a request's load budget against a storage server paced far below the load.

The storage server paces every kv-get (layerwise, ``theta_bytes = 0``) to one layer of the
16-chunk load per two seconds, with no burst credit (``burst_layers = 0``): the tiny model's first
layer goes at once, its second two seconds later. (With one layer of burst credit, the GCRA bucket
lets a two-layer load through unpaced: the budget was then never exercised.) Under a load budget
the connector asks the node, in its kv-lookup, how much of the prefix lands in time, and vLLM gets
that as its hit: with 100 ms nothing does (the request computes everything, without waiting); with
3 s half of the prefix does (a partial hit: ``num_cached_tokens`` is half the full hit, the other
blocks are computed); in both the tokens are exactly the no-cache ones. Without a budget the same
request waits and loads it all. (A load that falls behind anyway is cut at its deadline and
recomputed: ``test_vllm_worker.py``, ``tests/storage_server/test_kv_load_budget.py``.)
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from support import ServerProcess, boto_client, make_tenants, write_config
from test_vllm_connector import Engine, keys_of, wait_stored
from vllm_support import BLOCK

from client_sdk.sync import SyncObjectCacheClient
from client_sdk.vllm_connector.config import REQUEST_BUDGET

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install 'objectcache[vllm]'; make test does)")

BUCKET = "deadline-kv"
MAX_TOKENS = 6
PROMPT = np.random.default_rng(2).integers(3, 400, size=16 * BLOCK + 5).tolist()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    import subprocess
    import sys

    from support import REPO

    path = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run([sys.executable, str(REPO / "tests" / "tinymodel.py"), str(path)], check=True, capture_output=True, timeout=240)
    return str(path)


@pytest.fixture(scope="module")
def paced(tmp_path_factory):
    root = tmp_path_factory.mktemp("paced-node")
    tenant = make_tenants("d")[0]
    layer_bytes = 16 * 2 * BLOCK * 2 * 32 * 4  # 16 chunks × (K,V) × 32 tokens × 2 KV heads × head_dim 32 × fp32
    gbps = layer_bytes * 8 / 1e9 / 2           # a layer per two seconds
    config = write_config(root / "c.toml", root / "data", [tenant], extra=(
        f'\n[storage_server]\ntheta_bytes = 0\n\n[bandwidth]\ncapacity_gbps = {gbps!r}\npolicy = "equal"\nburst_layers = 0\n'))
    server = ServerProcess(config).start()
    boto_client(server.endpoint, tenant).create_bucket(Bucket=BUCKET)
    yield server, tenant
    server.stop()


@pytest.fixture(scope="module")
def engine(paced, model_dir, tmp_path_factory):
    server, tenant = paced
    extra = {"endpoint": server.endpoint, "access_key": tenant.access_key, "secret_key": tenant.secret_key, "bucket": BUCKET}
    e = Engine({"model": model_dir, "extra_config": extra}, tmp_path_factory.mktemp("engine"))
    yield e
    e.close()


def _generate(engine: Engine, params: dict | None = None) -> dict:
    return engine.call(op="generate", prompts=[PROMPT], max_tokens=MAX_TOKENS, transfer_params=[params])[0]  # type: ignore[index]


def test_a_budget_gets_the_prefix_that_lands_in_time_as_a_partial_hit_and_no_budget_waits(engine, paced, model_dir):
    server, tenant = paced
    computed = _generate(engine)
    assert computed["cached"] == 0
    with SyncObjectCacheClient(server.endpoint, tenant.access_key, tenant.secret_key, BUCKET) as sdk:
        wait_stored(sdk, keys_of(model_dir, PROMPT))

    before = engine.call(op="stats")
    budgeted = _generate(engine, {REQUEST_BUDGET: 0.1})
    after = engine.call(op="stats")
    # The node says no chunk lands within 100 ms (its second layer waits 2 s): nothing is loaded, all is computed.
    assert budgeted == {"tokens": computed["tokens"], "cached": 0}, budgeted
    assert after["loaded_chunks"] == before["loaded_chunks"] and after["failed_loads"] == before["failed_loads"], after

    # 3 s: the node expects (0.75·3 − 0.01 epoch) s × 8 chunks' layer per s / 2 layers = 8.96 → 8 of the 16 chunks
    # in time (their second layer goes after 1 s); vLLM takes them as a partial hit and computes the other 8 blocks.
    partial = _generate(engine, {REQUEST_BUDGET: 3.0})
    assert partial == {"tokens": computed["tokens"], "cached": 8 * BLOCK}, partial
    later = engine.call(op="stats")
    assert later["loaded_chunks"] == after["loaded_chunks"] + 8 and later["failed_loads"] == after["failed_loads"], \
        f"the deliverable prefix did not land within its budget: {later}"

    waited = _generate(engine)
    assert waited == {"tokens": computed["tokens"], "cached": 16 * BLOCK}
    final = engine.call(op="stats")
    assert final["loaded_chunks"] == later["loaded_chunks"] + 16 and final["failed_loads"] == later["failed_loads"]
