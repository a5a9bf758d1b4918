"""KV tensors for ``bench compression``: real ones from the test model, and synthetic bf16 ones (labelled as such).

Real KV: the tiny Llama the vLLM tests run (``tests/tinymodel.py``: 2 layers, 2 KV heads × head_dim 32,
seeded random weights), built into a temporary directory and run once over a token stream with
``transformers``; its per-layer keys and values, cast to bf16, become KV_L2TD layer slices
``(2, G, n_kv·d)`` exactly as the connector stores them. Needs torch and transformers (the vllm
extra); without them, or without the source tree's tests/, only synthetic KV is available.

Synthetic KV: bf16 keys with per-channel scales (a few outlier channels, as real keys have) and
values with per-token scales, in Llama 3.1 8B's slice shape (8 KV heads × 128). Not a model's output.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass

import numpy as np

from protocol.codecs import SliceLayout

from .harness import REPO

TINY_MODEL_SCRIPT = REPO / "tests" / "tinymodel.py"
DTYPE = "bfloat16"


@dataclass
class KVSample:
    """Layer slices of one dataset: ``slices[i]`` is ``layout.nbytes`` raw bf16 bytes (uint8)."""

    name: str
    label: str
    layout: SliceLayout
    slices: list[np.ndarray]

    @property
    def slice_bytes(self) -> int:
        return self.layout.nbytes(DTYPE)


def to_bf16_bytes(values: np.ndarray) -> np.ndarray:
    """float32 → bf16 (round to nearest even) as uint8 bytes."""
    u = np.ascontiguousarray(values, np.float32).reshape(-1).view(np.uint32)
    return ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16).view(np.uint8)


def real_kv_available() -> tuple[bool, str]:
    if not TINY_MODEL_SCRIPT.exists():
        return False, "tests/tinymodel.py not in this tree"
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        return False, f"needs torch and transformers (the vllm extra): {e}"
    return True, ""


def real_kv(tokens: int, chunk_tokens: int, seed: int = 0) -> KVSample:
    """KV of the test model over ``tokens`` tokens, cut into ``chunk_tokens``-token layer slices."""
    import torch
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory(prefix="objectcache-bench-model-") as tmp:
        subprocess.run([sys.executable, str(TINY_MODEL_SCRIPT), tmp], check=True, capture_output=True, timeout=300)
        model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
    model.eval()
    vocab = model.config.vocab_size
    rng = np.random.default_rng(seed)
    # A token stream that repeats phrases (like real prompts) rather than uniform noise.
    phrases = [rng.integers(2, vocab, size=int(rng.integers(4, 24))) for _ in range(40)]
    stream: list[int] = []
    while len(stream) < tokens:
        stream.extend(phrases[int(rng.integers(len(phrases)))].tolist())
    ids = torch.tensor([stream[:tokens]])
    with torch.no_grad():
        past = model(ids, use_cache=True).past_key_values
    layers = [(layer_kv[0], layer_kv[1]) for layer_kv in _layers(past)]
    heads, head_dim = layers[0][0].shape[1], layers[0][0].shape[3]
    layout = SliceLayout(2, chunk_tokens, heads * head_dim)
    slices = []
    for start in range(0, tokens - chunk_tokens + 1, chunk_tokens):
        for k, v in layers:  # [1, heads, T, d] -> (T, heads·d) per plane
            kk = k[0, :, start:start + chunk_tokens].permute(1, 0, 2).reshape(chunk_tokens, -1).numpy()
            vv = v[0, :, start:start + chunk_tokens].permute(1, 0, 2).reshape(chunk_tokens, -1).numpy()
            slices.append(to_bf16_bytes(np.stack([kk, vv])))
    label = (f"real: KV of the test model (tests/tinymodel.py, {len(layers)} layers, {heads} KV heads × {head_dim}) "
             f"over {tokens} tokens, bf16")
    return KVSample("tiny-model", label, layout, slices)


def _layers(past):
    """Per-layer (key, value) from a transformers cache, old tuple or new Cache object."""
    if hasattr(past, "layers"):
        return [(layer.keys, layer.values) for layer in past.layers]
    if hasattr(past, "key_cache"):
        return list(zip(past.key_cache, past.value_cache))
    return [(k, v) for k, v in past]


def synthetic_kv(count: int, chunk_tokens: int, heads: int = 8, head_dim: int = 128, seed: int = 0) -> KVSample:
    """``count`` synthetic bf16 layer slices in Llama 3.1 8B's shape (see the module docstring)."""
    rng = np.random.default_rng(seed)
    channels = heads * head_dim
    layout = SliceLayout(2, chunk_tokens, channels)
    slices = []
    for _ in range(count):
        key_scale = rng.lognormal(0.0, 0.6, channels).astype(np.float32)
        key_scale[rng.choice(channels, max(1, channels // 64), replace=False)] *= 8.0  # outlier channels
        keys = rng.standard_normal((chunk_tokens, channels), np.float32) * key_scale
        value_scale = rng.lognormal(-1.0, 0.3, (chunk_tokens, 1)).astype(np.float32)
        values = rng.standard_normal((chunk_tokens, channels), np.float32) * value_scale
        slices.append(to_bf16_bytes(np.stack([keys, values])))
    label = f"synthetic: bf16 Gaussian KV (keys per-channel scales with outliers, values per-token), {heads}×{head_dim} channels — not model output"
    return KVSample("synthetic-bf16", label, layout, slices)
