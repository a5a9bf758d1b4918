"""Keys that cannot cross tenants or ``cache_salt``s, with real vLLM engines on one ObjectCache server.

Two tenants (alice, bob) each run an engine with the connector against the session's server, each
with its own bucket; the identical prompt never hits across them, checked by vLLM's
``num_cached_tokens`` and by the objects each bucket holds. One engine sending the identical
prompt under two ``cache_salt``s (and none) gets no hit across them either, and a salt's own repeat
does hit (so the checks can fail). vLLM's own prefix cache is off (see ``vllm_support.make_llm``).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
from support import REPO, boto_client
from test_vllm_connector import Engine, keys_of, wait_stored
from vllm_support import BLOCK

from client_sdk.sync import SyncObjectCacheClient
from protocol.errors import ErrorCode, S3Error

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install 'objectcache[vllm]'; make test does)")

MAX_TOKENS = 8
rng = np.random.default_rng(31)
PROMPT = rng.integers(3, 400, size=4 * BLOCK + 11).tolist()          # the tenants' identical prompt
SALTED = rng.integers(3, 400, size=3 * BLOCK + 5).tolist()           # one tenant, several salts


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run([sys.executable, str(REPO / "tests" / "tinymodel.py"), str(path)], check=True, capture_output=True, timeout=240)
    return str(path)


def _extra(server, tenant, bucket: str) -> dict:
    return {"endpoint": server.endpoint, "access_key": tenant.access_key, "secret_key": tenant.secret_key, "bucket": bucket,
            "transport": "auto"}


def _objects(server, tenant, bucket: str) -> set[str]:
    s3 = boto_client(server.endpoint, tenant)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {o["Key"] for page in pages for o in page.get("Contents", [])}


@pytest.fixture(scope="module")
def engines(server, tenants, model_dir, tmp_path_factory):
    """Alice's and bob's engines, started together (each start costs seconds), each with its own bucket."""
    for name in ("alice", "bob"):
        with _sdk(server, tenants[name], f"iso-{name}") as sdk:
            sdk.ensure_bucket()
    a = Engine({"model": model_dir, "extra_config": _extra(server, tenants["alice"], "iso-alice")}, tmp_path_factory.mktemp("alice"))
    b = Engine({"model": model_dir, "extra_config": _extra(server, tenants["bob"], "iso-bob")}, tmp_path_factory.mktemp("bob"))
    yield a, b
    a.close()
    b.close()


def _sdk(server, tenant, bucket: str) -> SyncObjectCacheClient:
    return SyncObjectCacheClient(server.endpoint, tenant.access_key, tenant.secret_key, bucket)


def _generate(engine: Engine, prompt: list[int], salt: str | None = None) -> dict:
    return engine.call(op="generate", prompts=[prompt], max_tokens=MAX_TOKENS, salts=[salt])[0]  # type: ignore[index]


def test_two_tenants_with_the_identical_prompt_never_hit_each_others_cache(engines, server, tenants, model_dir):
    alice, bob = engines
    keys = keys_of(model_dir, PROMPT)
    assert len(keys) == 4
    first = _generate(alice, PROMPT)
    assert first["cached"] == 0
    with _sdk(server, tenants["alice"], "iso-alice") as sdk:
        wait_stored(sdk, keys)
    alice_objects = _objects(server, tenants["alice"], "iso-alice")
    assert set(keys) <= alice_objects
    # The same tenant's repeat hits: the cache works, so the misses below are isolation.
    assert _generate(alice, PROMPT) == {"tokens": first["tokens"], "cached": 4 * BLOCK}

    out = _generate(bob, PROMPT)
    assert out == {"tokens": first["tokens"], "cached": 0}, "bob was served alice's KV"
    with _sdk(server, tenants["bob"], "iso-bob") as sdk:
        wait_stored(sdk, keys)  # bob computed and stored his own copy, in his own bucket
    # Bob cannot even ask about alice's bucket (no timing side channel through lookups either).
    with _sdk(server, tenants["bob"], "iso-alice") as sdk, pytest.raises(S3Error) as e:
        sdk.lookup(keys)
    assert e.value.code is ErrorCode.AccessDenied
    assert _objects(server, tenants["bob"], "iso-bob") == set(keys)
    assert _objects(server, tenants["alice"], "iso-alice") == alice_objects, "bob's engine wrote into alice's bucket"


def test_different_cache_salts_never_hit_each_other(engines, server, tenants, model_dir):
    alice, _ = engines
    s1, s2 = keys_of(model_dir, SALTED, "salt-one"), keys_of(model_dir, SALTED, "salt-two")
    plain = keys_of(model_dir, SALTED)
    assert len({*s1, *s2, *plain}) == 9
    before = _objects(server, tenants["alice"], "iso-alice")
    with _sdk(server, tenants["alice"], "iso-alice") as sdk:
        first = _generate(alice, SALTED, "salt-one")
        assert first["cached"] == 0
        wait_stored(sdk, s1)
        assert _objects(server, tenants["alice"], "iso-alice") - before == set(s1)

        second = _generate(alice, SALTED, "salt-two")
        assert second == {"tokens": first["tokens"], "cached": 0}, "salt-two was served salt-one's KV"
        wait_stored(sdk, s2)
        assert _objects(server, tenants["alice"], "iso-alice") - before == set(s1) | set(s2)

        unsalted = _generate(alice, SALTED)
        assert unsalted == {"tokens": first["tokens"], "cached": 0}, "an unsalted request was served salted KV"
        wait_stored(sdk, plain)
        assert _objects(server, tenants["alice"], "iso-alice") - before == set(s1) | set(s2) | set(plain)

        # The salt's own repeat hits: the cache works, so the misses above are isolation.
        assert _generate(alice, SALTED, "salt-one") == {"tokens": first["tokens"], "cached": 3 * BLOCK}
