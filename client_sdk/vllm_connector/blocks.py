"""vLLM's paged KV blocks ↔ the layers of ObjectCache chunk objects (KV_L2TD), as torch views.

A chunk's layer is ``[2][block_size][kv_heads][head_dim]`` (K then V; token; head; dim). vLLM's
CPU attention backend keeps each layer as ``[num_blocks, kv_heads, block_size, 2·head_dim]``
whose block/head interior is the block's K rows then its V rows (the backend views it as
``[num_blocks, kv_heads, 2·block_size, head_dim]`` and splits dim 2 in halves). :func:`chunk_view`
re-strides a layer as ``[num_blocks, 2, block_size, kv_heads, head_dim]`` without copying, so a
gather (``view[block_ids]``) yields chunk layers and a scatter (``view[block_ids] = layers``)
writes straight into vLLM's blocks.
"""

from __future__ import annotations

import torch

from ..layout import KVLayout

# torch dtype → KVLayout dtype name (what a chunk's bytes are)
DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32", torch.uint8: "uint8", torch.int8: "int8"}


def chunk_view(kv_layer: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[num_blocks, 2, block_size, kv_heads, head_dim]`` over the CPU backend's layer tensor (no copy).

    Other backends' layouts are refused rather than guessed: a wrong guess would load wrong KV
    without any error.
    """
    if kv_layer.device.type != "cpu":
        raise ValueError(f"KV cache on {kv_layer.device}: only vLLM's CPU attention layout is supported so far")
    if kv_layer.dim() != 4 or kv_layer.shape[2] != block_size or kv_layer.shape[3] % 2:
        raise ValueError(f"expected a KV layer [num_blocks, kv_heads, {block_size}, 2·head_dim], got {list(kv_layer.shape)} "
                         "(only vLLM's CPU attention layout is supported)")
    if not kv_layer.is_contiguous():
        raise ValueError("the KV layer is not contiguous; its blocks cannot be re-strided in place")
    nb, heads, tokens, two_d = kv_layer.shape
    return kv_layer.view(nb, heads, 2, tokens, two_d // 2).permute(0, 2, 3, 1, 4)


def layout_of(views: list[torch.Tensor]) -> KVLayout:
    """The :class:`KVLayout` of chunks made from these layer views (all alike)."""
    first = views[0]
    for v in views[1:]:
        if v.shape[1:] != first.shape[1:] or v.dtype != first.dtype:
            raise ValueError(f"KV layers differ: {list(v.shape)} {v.dtype} vs {list(first.shape)} {first.dtype}")
    if first.dtype not in DTYPES:
        raise ValueError(f"KV cache dtype {first.dtype} has no chunk dtype; supported: {', '.join(map(str, DTYPES))}")
    _, _, tokens, heads, dim = first.shape
    return KVLayout(num_layers=len(views), chunk_tokens=tokens, kv_heads=heads, head_dim=dim, dtype=DTYPES[first.dtype])


def layer_from_bytes(buf: memoryview, num_chunks: int, layout: KVLayout, dtype: torch.dtype) -> torch.Tensor:
    """One layer of a layer-major payload (``N·S`` bytes) as ``[N, 2, block_size, kv_heads, head_dim]``, no copy."""
    return torch.frombuffer(buf, dtype=dtype).view(num_chunks, 2, layout.chunk_tokens, layout.kv_heads, layout.head_dim)
