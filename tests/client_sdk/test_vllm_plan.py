"""The vLLM connector's pure parts: settings, namespaces, token blocks → chunk keys, load and save plans (no vLLM needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import REPO

from client_sdk import chunk_keys
from client_sdk.vllm_connector.config import ConnectorConfig, namespace
from client_sdk.vllm_connector.plan import ChunkTransfer, RequestState, chunks_to_save, external_tokens, first_blocks, load_transfer, loadable_chunks, merge

EXTRA = {"endpoint": "http://127.0.0.1:9000", "access_key": "AK", "secret_key": "SK"}


def test_settings_come_from_the_extra_config_then_the_environment():
    env = {"AWS_ENDPOINT_URL": "http://env:1", "AWS_ACCESS_KEY_ID": "envak", "AWS_SECRET_ACCESS_KEY": "envsk", "AWS_DEFAULT_REGION": "eu-west-1"}
    c = ConnectorConfig.from_extra({"endpoint": "http://cfg:2", "bucket": "b", "transport": "shm"}, env)
    assert (c.endpoint, c.access_key, c.secret_key, c.region, c.bucket, c.transport) == ("http://cfg:2", "envak", "envsk", "eu-west-1", "b", "shm")
    assert ConnectorConfig.from_extra(EXTRA, {}).bucket == "kv-cache"


@pytest.mark.parametrize("extra, words", [
    ({}, ["endpoint is not set", "access_key is not set", "AWS_SECRET_ACCESS_KEY"]),
    ({**EXTRA, "transport": "carrier-pigeon"}, ["transport must be one of", "carrier-pigeon"]),
    ({**EXTRA, "bukket": "x"}, ["unknown field", "bukket"]),
    ({**EXTRA, "mode": "sideways"}, ["mode must be one of", "sideways"]),
    ({**EXTRA, "overlap": "sometimes"}, ["overlap must be one of", "sometimes"]),
    ({**EXTRA, "load_timeout_s": "soon"}, ["load_timeout_s must be a number"]),
    ({**EXTRA, "load_timeout_s": 0}, ["load_timeout_s must be > 0"]),
])
def test_bad_settings_are_refused_naming_the_field(extra, words):
    with pytest.raises(ValueError) as e:
        ConnectorConfig.from_extra(extra, {})
    assert all(w in str(e.value) for w in words), str(e.value)


def test_the_namespace_keeps_models_dtypes_and_shards_apart():
    c = ConnectorConfig.from_extra(EXTRA, {})
    spaces = {namespace(c, "meta-llama/Llama-3.1-8B", "bfloat16", 0, 2), namespace(c, "meta-llama/Llama-3.1-8B", "bfloat16", 1, 2),
              namespace(c, "meta-llama/Llama-3.1-8B", "float16", 0, 2), namespace(c, "Qwen/Qwen2.5-7B", "bfloat16", 0, 2),
              namespace(c, "meta-llama/Llama-3.1-8B", "bfloat16", 0, 2, 1, 2)}
    assert len(spaces) == 5
    assert namespace(c, "m/", "bfloat16", 0, 1) == "vllm/m/bfloat16/tp0of1"
    named = ConnectorConfig.from_extra({**EXTRA, "namespace": "llama-8b"}, {})
    assert namespace(named, "/models/a/llama", "bfloat16", 3, 4) == namespace(named, "/other/path", "bfloat16", 3, 4) == "llama-8b/bfloat16/tp3of4"
    with pytest.raises(ValueError, match="namespace"):
        namespace(c, "x" * 600, "bfloat16", 0, 1)


def test_keys_are_the_rolling_prefix_hash_with_one_chunk_per_block():
    prompt = list(range(100, 200))  # 100 tokens, block size 32: 3 full blocks
    st = RequestState.for_prompt(prompt, 32, "ns")
    assert st.keys == chunk_keys(prompt, 32, "ns") and len(st.keys) == 3
    assert st.loadable == 3
    # A prompt of exactly 3 blocks: 3 keys to save, but only 2 loadable (vLLM computes the last token itself).
    exact = RequestState.for_prompt(prompt[:96], 32, "ns")
    assert len(exact.keys) == 3 and exact.loadable == 2
    assert RequestState.for_prompt(prompt[:31], 32, "ns").keys == []
    # Same prefix, different continuation: the shared blocks have the same keys, the rest differ.
    other = RequestState.for_prompt(prompt[:64] + [7] * 40, 32, "ns")
    assert other.keys[:2] == st.keys[:2] and other.keys[2] != st.keys[2]


@pytest.mark.parametrize("n, block, loadable", [(0, 32, 0), (1, 32, 0), (32, 32, 0), (33, 32, 1), (64, 32, 1), (65, 32, 2)])
def test_loadable_chunks_leave_the_last_token_to_compute(n, block, loadable):
    assert loadable_chunks(n, block) == loadable


def test_external_tokens_count_only_what_vllm_does_not_have():
    assert external_tokens(4, 0, 32) == 128
    assert external_tokens(4, 64, 32) == 64
    assert external_tokens(2, 96, 32) == 0


def test_a_load_maps_chunks_after_the_local_prefix_to_their_blocks():
    keys = [f"k{i}" for i in range(5)]
    blocks = [40, 41, 42, 43, 44, 45]
    t = load_transfer("r", keys, blocks, num_computed_tokens=64, num_external_tokens=96, block_size=32)
    assert t == ChunkTransfer("r", ("k2", "k3", "k4"), (42, 43, 44))
    with pytest.raises(ValueError, match="block boundaries"):
        load_transfer("r", keys, blocks, 64, 40, 32)
    with pytest.raises(ValueError, match="chunks"):
        load_transfer("r", keys, blocks, 64, 128, 32)


def test_saves_cover_the_blocks_a_step_completes_once():
    st = RequestState(keys=[f"k{i}" for i in range(5)], loadable=4, stored=1)
    assert chunks_to_save(st, 40, 32) == range(1, 1)       # the step ends inside block 1
    assert chunks_to_save(st, 130, 32) == range(1, 4)      # blocks 1..3 complete
    st.stored = 4
    assert chunks_to_save(st, 1000, 32) == range(4, 5)     # capped at the prompt's full blocks
    st.stored = 5
    assert not chunks_to_save(st, 1000, 32)


def test_merging_transfers_fetches_a_shared_chunk_once_and_fills_every_block():
    a = ChunkTransfer("a", ("k0", "k1"), (1, 2))
    b = ChunkTransfer("b", ("k0", "k1", "k2"), (7, 8, 9))
    keys, index, blocks = merge([a, b])
    assert keys == ["k0", "k1", "k2"]
    assert list(zip(index, blocks)) == [(0, 1), (1, 2), (0, 7), (1, 8), (2, 9)]
    assert first_blocks(keys, index, blocks) == [1, 2, 9]
    with pytest.raises(ValueError):
        ChunkTransfer("c", ("k",), (1, 2))


def test_the_pure_parts_import_without_vllm_or_torch():
    code = ("import sys, client_sdk.vllm_connector, client_sdk.vllm_connector.plan, client_sdk.vllm_connector.config, "
            "client_sdk.vllm_connector.scheduler\nprint(sorted(m for m in ('vllm', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60, check=True).stdout
    assert out.strip() == "[]"
