"""KV cache groups: one full-attention group is served; anything else is refused at start-up, by name.

The specs are vLLM's own classes; the sliding-window + full-attention model is grouped by vLLM's
own functions the way it is with this connector (hybrid KV cache manager off): one group.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from client_sdk.vllm_connector.groups import check_kv_cache_groups

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install 'objectcache[vllm]'; make test does)")


@pytest.fixture(scope="module")
def v() -> SimpleNamespace:
    """torch and vLLM's spec classes and grouping functions, imported here, not at collection: importing them took
    15 s of CPU in every pytest-xdist worker that collected this module, whichever worker ran it."""
    import torch
    from vllm.v1.core.kv_cache_utils import _get_kv_cache_groups_uniform_spec, unify_hybrid_kv_cache_specs
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, FullAttentionSpec, KVCacheGroupSpec, MLAAttentionSpec, SlidingWindowSpec

    heads = {"block_size": 32, "num_kv_heads": 2, "head_size": 32, "dtype": torch.float32}
    return SimpleNamespace(torch=torch, uniform_groups=_get_kv_cache_groups_uniform_spec, unify=unify_hybrid_kv_cache_specs,
                           ChunkedLocal=ChunkedLocalAttentionSpec, Group=KVCacheGroupSpec, MLA=MLAAttentionSpec, heads=heads,
                           full=lambda: FullAttentionSpec(**heads), sliding=lambda window=128: SlidingWindowSpec(**heads, sliding_window=window))


def test_one_full_attention_group_and_mla_are_served(v):
    check_kv_cache_groups([v.Group([f"model.layers.{i}.self_attn.attn" for i in range(4)], v.full())])
    check_kv_cache_groups([v.Group(["model.layers.0.self_attn.attn"], v.MLA(block_size=32, num_kv_heads=1, head_size=576, dtype=v.torch.bfloat16))])


def test_sliding_window_and_full_attention_as_two_groups_are_refused_naming_both(v):
    groups = [v.Group(["l.0", "l.2"], v.full()), v.Group(["l.1", "l.3", "l.5"], v.sliding(4096))]
    with pytest.raises(ValueError, match="one KV cache group; this model has 2") as e:
        check_kv_cache_groups(groups)
    assert "FullAttentionSpec × 2 layers" in str(e.value) and "SlidingWindowSpec(window 4096) × 3 layers" in str(e.value)


@pytest.mark.parametrize("kind", ["sliding", "chunked-local"])
def test_a_single_group_that_drops_kv_outside_its_window_is_refused_by_name(v, kind):
    spec = v.sliding() if kind == "sliding" else v.ChunkedLocal(**v.heads, attention_chunk_size=64)
    with pytest.raises(ValueError, match=type(spec).__name__ + ".*is not supported"):
        check_kv_cache_groups([v.Group(["l.0", "l.1"], spec)])


def test_no_group_at_all_is_refused():
    with pytest.raises(ValueError, match="has 0: none"):
        check_kv_cache_groups([])


def test_a_sliding_plus_full_model_is_one_full_attention_group_with_the_hybrid_manager_off(v):
    """What vLLM does for this connector (it does not declare SupportsHMA): the sliding-window layers keep full KV."""
    specs = {"l.0": v.full(), "l.1": v.sliding(), "l.2": v.full(), "l.3": v.sliding()}
    v.unify(specs)
    groups = v.uniform_groups(specs)
    assert len(groups) == 1 and sorted(groups[0].layer_names) == sorted(specs)
    check_kv_cache_groups(groups)
