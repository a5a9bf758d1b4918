"""KV cache groups: one full-attention group is served; anything else is refused at start-up, by name.

The specs are vLLM's own classes; the sliding-window + full-attention model is grouped by vLLM's
own functions the way it is with this connector (hybrid KV cache manager off): one group.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'objectcache[vllm]'; make test does)")
import torch  # noqa: E402
from vllm.v1.core.kv_cache_utils import _get_kv_cache_groups_uniform_spec, unify_hybrid_kv_cache_specs  # noqa: E402
from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, FullAttentionSpec, KVCacheGroupSpec, MLAAttentionSpec, SlidingWindowSpec  # noqa: E402

from client_sdk.vllm_connector.groups import check_kv_cache_groups  # noqa: E402

HEADS = {"block_size": 32, "num_kv_heads": 2, "head_size": 32, "dtype": torch.float32}


def _full() -> FullAttentionSpec:
    return FullAttentionSpec(**HEADS)


def _sliding(window: int = 128) -> SlidingWindowSpec:
    return SlidingWindowSpec(**HEADS, sliding_window=window)


def test_one_full_attention_group_and_mla_are_served():
    check_kv_cache_groups([KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn" for i in range(4)], _full())])
    check_kv_cache_groups([KVCacheGroupSpec(["model.layers.0.self_attn.attn"], MLAAttentionSpec(block_size=32, num_kv_heads=1,
                                                                                               head_size=576, dtype=torch.bfloat16))])


def test_sliding_window_and_full_attention_as_two_groups_are_refused_naming_both():
    groups = [KVCacheGroupSpec(["l.0", "l.2"], _full()), KVCacheGroupSpec(["l.1", "l.3", "l.5"], _sliding(4096))]
    with pytest.raises(ValueError, match="one KV cache group; this model has 2") as e:
        check_kv_cache_groups(groups)
    assert "FullAttentionSpec × 2 layers" in str(e.value) and "SlidingWindowSpec(window 4096) × 3 layers" in str(e.value)


@pytest.mark.parametrize("spec", [_sliding(), ChunkedLocalAttentionSpec(**HEADS, attention_chunk_size=64)], ids=["sliding", "chunked-local"])
def test_a_single_group_that_drops_kv_outside_its_window_is_refused_by_name(spec):
    with pytest.raises(ValueError, match=type(spec).__name__ + ".*is not supported"):
        check_kv_cache_groups([KVCacheGroupSpec(["l.0", "l.1"], spec)])


def test_no_group_at_all_is_refused():
    with pytest.raises(ValueError, match="has 0: none"):
        check_kv_cache_groups([])


def test_a_sliding_plus_full_model_is_one_full_attention_group_with_the_hybrid_manager_off():
    """What vLLM does for this connector (it does not declare SupportsHMA): the sliding-window layers keep full KV."""
    specs = {"l.0": _full(), "l.1": _sliding(), "l.2": _full(), "l.3": _sliding()}
    unify_hybrid_kv_cache_specs(specs)
    groups = _get_kv_cache_groups_uniform_spec(specs)
    assert len(groups) == 1 and sorted(groups[0].layer_names) == sorted(specs)
    check_kv_cache_groups(groups)
