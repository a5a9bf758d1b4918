"""What goes into a chunk key: the salt (vLLM's ``cache_salt``) and every part of the KV's identity."""

from __future__ import annotations

from client_sdk import chunk_keys
from client_sdk.vllm_connector.config import ConnectorConfig, namespace
from client_sdk.vllm_connector.plan import RequestState

TOKENS = list(range(3, 3 + 64))
C = ConnectorConfig("http://unused", "a", "b")


def test_a_salt_changes_every_key_and_never_shows_in_it():
    plain = chunk_keys(TOKENS, 16, "ns")
    one, two = chunk_keys(TOKENS, 16, "ns", "tenant-one"), chunk_keys(TOKENS, 16, "ns", "tenant-two")
    assert len(plain) == len(one) == len(two) == 4
    assert not ({*plain} & {*one}) and not ({*one} & {*two}) and not ({*plain} & {*two})
    assert chunk_keys(TOKENS, 16, "ns", "tenant-one") == one          # deterministic
    assert chunk_keys(TOKENS, 16, "ns", "") == chunk_keys(TOKENS, 16, "ns", None) == plain
    assert all(k.startswith("ns/") and "tenant" not in k for k in one)
    # The request state the scheduler keeps carries the salt into its keys.
    assert RequestState.for_prompt(TOKENS, 16, "ns", "tenant-one").keys == one


def test_every_part_of_the_kv_identity_separates_namespaces():
    base = dict(revision="abc123", block_size=16, layout="kv")
    spaces = {namespace(C, "meta-llama/Llama-3.1-8B", "bfloat16", 0, 1, **base),
              namespace(C, "meta-llama/Llama-3.1-8B", "bfloat16", 0, 1, **{**base, "revision": "def456"}),
              namespace(C, "meta-llama/Llama-3.1-8B", "bfloat16", 0, 1, **{**base, "block_size": 32}),
              namespace(C, "meta-llama/Llama-3.1-8B", "bfloat16", 0, 1, **{**base, "layout": "mla"}),
              namespace(C, "meta-llama/Llama-3.1-8B", "float16", 0, 1, **base),
              namespace(C, "meta-llama/Llama-3.1-8B", "bfloat16", 1, 2, **base)}
    assert len(spaces) == 6
    assert namespace(C, "m/", "bfloat16", 0, 1, **base) == "vllm/m@abc123/bfloat16/b16/kv/tp0of1"
    # A configured namespace replaces the model path, not the revision nor the rest.
    named = ConnectorConfig("http://unused", "a", "b", namespace="llama-8b")
    assert namespace(named, "/a/llama", "bfloat16", 0, 1, **base) == "llama-8b@abc123/bfloat16/b16/kv/tp0of1"
