"""Model KV layouts: what one chunk object holds and how big it is.

A chunk object holds all layers of ``chunk_tokens`` tokens in KV_L2TD order
(layer-major; within a layer K then V; then token; then hidden dimension).
Its per-layer size is ``S = 2 · G · n_kv · d · p`` bytes and the object is
exactly ``L · S`` bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8": 1, "int8": 1, "uint8": 1}
# numpy has no bfloat16: its bytes are viewed as uint16.
NUMPY_DTYPE = {"bfloat16": np.uint16, "float16": np.float16, "float32": np.float32, "float8": np.uint8, "int8": np.int8, "uint8": np.uint8}


@dataclass(frozen=True)
class KVLayout:
    num_layers: int
    chunk_tokens: int
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
        for name in ("num_layers", "chunk_tokens", "kv_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def bytes_per_token_per_layer(self) -> int:
        return 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def per_layer_chunk_bytes(self) -> int:
        """S = 2 · G · n_kv · d · p."""
        return self.chunk_tokens * self.bytes_per_token_per_layer

    @property
    def chunk_bytes(self) -> int:
        """L · S: the size of one chunk object."""
        return self.num_layers * self.per_layer_chunk_bytes

    def payload_bytes(self, num_chunks: int) -> int:
        return num_chunks * self.chunk_bytes

    @property
    def numpy_dtype(self) -> np.dtype:
        return np.dtype(NUMPY_DTYPE[self.dtype])

    @classmethod
    def preset(cls, model: str, chunk_tokens: int = 16, dtype: str = "bfloat16") -> "KVLayout":
        try:
            layers, kv_heads, head_dim = PRESETS[model.lower()]
        except KeyError:
            raise ValueError(f"unknown model {model!r}; presets: {', '.join(PRESETS)}") from None
        return cls(layers, chunk_tokens, kv_heads, head_dim, dtype)


# (num_layers, kv_heads, head_dim) from each model's config.json
PRESETS: dict[str, tuple[int, int, int]] = {
    "llama-3.1-8b": (32, 8, 128),
    "qwen2.5-7b": (28, 4, 128),
    "mistral-7b": (32, 8, 128),
    "deepseek-r1-distill-qwen-7b": (28, 4, 128),
}
