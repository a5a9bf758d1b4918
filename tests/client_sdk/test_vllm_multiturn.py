"""Multi-turn reuse: blocks filled by decoding are saved, so the next turn's prompt (which holds the
previous answer) loads them too, with exactly the no-cache tokens.

Turn 1's prompt is 2 blocks and 10 tokens; 60 generated tokens fill two more blocks (133 computed
positions). Turn 2's prompt is turn 1's prompt, its answer and 20 new tokens: 4 of its blocks are
stored, 2 of them only because decode-produced blocks are saved. The no-cache tokens come from the
same engine under a fresh ``cache_salt`` (which never hits, see test_vllm_isolation.py).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
from support import REPO
from test_vllm_connector import Engine, keys_of, wait_stored
from vllm_support import BLOCK

from client_sdk.sync import SyncObjectCacheClient

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install 'objectcache[vllm]'; make test does)")

BUCKET = "multiturn"
rng = np.random.default_rng(5)
TURN1 = rng.integers(3, 400, size=2 * BLOCK + 10).tolist()
USER2 = rng.integers(3, 400, size=20).tolist()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run([sys.executable, str(REPO / "tests" / "tinymodel.py"), str(path)], check=True, capture_output=True, timeout=240)
    return str(path)


@pytest.fixture(scope="module")
def setup(server, tenants, model_dir, tmp_path_factory):
    t = tenants["carol"]
    sdk = SyncObjectCacheClient(server.endpoint, t.access_key, t.secret_key, BUCKET)
    sdk.ensure_bucket()
    extra = {"endpoint": server.endpoint, "access_key": t.access_key, "secret_key": t.secret_key, "bucket": BUCKET}
    engine = Engine({"model": model_dir, "extra_config": extra}, tmp_path_factory.mktemp("engine"))
    yield engine, sdk
    engine.close()
    sdk.close()


def _generate(engine: Engine, prompt: list[int], max_tokens: int, salt: str | None = None) -> dict:
    return engine.call(op="generate", prompts=[prompt], max_tokens=max_tokens, salts=[salt])[0]  # type: ignore[index]


def test_the_next_turn_loads_the_previous_answer(setup, model_dir):
    engine, sdk = setup
    first = _generate(engine, TURN1, 60)
    assert first["cached"] == 0 and len(first["tokens"]) == 60
    history = TURN1 + first["tokens"]
    answer_keys = keys_of(model_dir, history)
    assert len(answer_keys) == 4   # blocks 2 and 3 hold generated tokens
    wait_stored(sdk, answer_keys)

    turn2 = history + USER2
    fresh = _generate(engine, turn2, 8, salt="no-cache")
    assert fresh["cached"] == 0
    second = _generate(engine, turn2, 8)
    assert second == {"tokens": fresh["tokens"], "cached": 4 * BLOCK}, "the previous answer's blocks were not reused"
