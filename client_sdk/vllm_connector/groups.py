"""Which vLLM KV cache groups the connector can serve: one group of full attention (pure, duck-typed).

One chunk holds every layer of one block, and a request's blocks come from one block table, so
the connector serves exactly one KV cache group whose layers keep every token's KV: full
attention (K/V pairs, or MLA's latent vector). A model mixing sliding-window and full-attention
layers runs as one full-attention group under the connector: vLLM turns its hybrid KV cache
manager off for a connector that does not declare ``SupportsHMA`` and then keeps full KV for the
sliding-window layers too (their attention still reads only the window), so its chunks are
complete. Anything else is refused at start-up by name, never loaded wrong: several groups
(layers vLLM could not unify, e.g. other page sizes), a group of sliding-window or chunked-local
layers only (vLLM frees their blocks outside the window: a save would read freed blocks), and
state caches (Mamba and others).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

# vLLM spec classes (``vllm.v1.kv_cache_interface``) by exact name: a subclass may change what a
# block holds (sinks, hidden states), so it is refused until it is known.
SUPPORTED_SPECS = ("FullAttentionSpec", "MLAAttentionSpec")


def describe(groups: Sequence[Any]) -> str:
    """``"FullAttentionSpec × 12 layers, SlidingWindowSpec(window 4096) × 36 layers"``."""
    parts = []
    for g in groups:
        spec = g.kv_cache_spec
        window = getattr(spec, "sliding_window", None)
        kind = type(spec).__name__ + (f"(window {window})" if window else "")
        parts.append(f"{kind} × {len(g.layer_names)} layer{'s' if len(g.layer_names) != 1 else ''}")
    return ", ".join(parts) or "none"


def check_kv_cache_groups(groups: Sequence[Any]) -> None:
    """Refuse, naming them, KV cache groups the connector cannot serve (see the module docstring)."""
    if len(groups) != 1:
        raise ValueError(f"ObjectCache's connector serves one KV cache group; this model has {len(groups)}: {describe(groups)}. "
                         "Models mixing sliding-window and full attention run as one group when vLLM's hybrid KV cache "
                         "manager is off (vLLM's default with this connector); other mixes are not supported")
    kind = type(groups[0].kv_cache_spec).__name__
    if kind not in SUPPORTED_SPECS:
        kinds = Counter(type(g.kv_cache_spec).__name__ for g in groups)
        raise ValueError(f"ObjectCache's connector stores full-attention KV ({', '.join(SUPPORTED_SPECS)}); "
                         f"this model's KV cache is {describe(groups)} ({', '.join(kinds)} is not supported)")
