"""vLLM's paged KV blocks ↔ the layers of ObjectCache chunk objects, as torch views (no copies).

vLLM (0.32) hands a connector one view per attention layer with the logical shape
``[num_blocks, head_slots, block_size, content]`` (``[B, H, N, C]``); its strides follow the
engine's resolved :class:`vllm.v1.kv_cache_layout.KVCacheLayout` (a stride order of
``[L, B, H, N, C]``: ``LBHNC``, ``LBNHC``, ``BLNHC``, ...), which vLLM itself builds with
``compute_layout_strides`` / ``create_kv_cache_views``. Indexing a view follows its strides, so one
gather/scatter works for every stride order. What ``C`` holds is the attention backend's, and is
known here by backend name (never guessed from a shape):

* ``token_kv`` — FlashAttention, FlashInfer: ``C = 2·head_dim``, a token's K then its V
  (the backends split ``C`` with ``split(head_size, dim=-1)``).
* ``block_kv`` — vLLM's CPU backend: ``C = 2·head_dim`` but a head's block is read as
  ``[2·block_size, head_dim]``, the block's K rows then its V rows (needs ``N`` and ``C`` dense).
* ``latent`` — MLA (DeepSeek-style): one head slot, ``C`` = the latent vector (no V).

A chunk layer is ``[2, block_size, kv_heads, head_dim]`` (KV_L2TD) for K/V backends and
``[block_size, latent_dim]`` for MLA (the ``mla`` namespace keeps the two apart; its
:class:`KVLayout` has ``kv_heads = 1``, ``head_dim = latent_dim / 2`` so sizes agree).
:func:`chunk_view` re-strides a layer as ``[num_blocks, *chunk layer]``: a gather (a save) is
``view[block_ids]``; a load's scatter is :func:`scatter_layer` into its :func:`as_array`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..layout import KVLayout

# torch dtype → KVLayout dtype name (what a chunk's bytes are)
DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32", torch.uint8: "uint8", torch.int8: "int8"}
# vLLM attention backend name (``AttentionBackend.get_name()``) → what its content dimension holds
CONTENT = {"FLASH_ATTN": "token_kv", "FLASHINFER": "token_kv", "CPU_ATTN": "block_kv",
           "FLASHMLA": "latent", "FLASH_ATTN_MLA": "latent", "FLASHINFER_MLA": "latent", "CUTLASS_MLA": "latent", "TRITON_MLA": "latent"}
# Each element width as an integer dtype numpy has (it has no bfloat16): what a load's scatter copies through.
WIDTHS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# The stride orders of vLLM 0.32's KVCacheLayout; CPU_ATTN reads only LBHNC.
LAYOUTS = ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")


@dataclass(frozen=True)
class PagedFormat:
    """An attention backend's paged layer: what its content holds and the engine's stride order."""

    backend: str
    layout: str = "LBHNC"

    def __post_init__(self) -> None:
        if self.backend not in CONTENT:
            raise ValueError(f"vLLM attention backend {self.backend!r} is not supported by ObjectCache's connector; "
                             f"supported: {', '.join(CONTENT)}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"vLLM KV cache layout {self.layout!r} is not known; known: {', '.join(LAYOUTS)}")
        if self.content == "block_kv" and self.layout != "LBHNC":
            raise ValueError(f"vLLM's {self.backend} backend reads only the LBHNC layout, not {self.layout}")

    @property
    def content(self) -> str:
        return CONTENT[self.backend]

    @property
    def namespace_layout(self) -> str:
        """The chunk layout's name in the key namespace: K/V pairs or MLA's latent vectors."""
        return "mla" if self.content == "latent" else "kv"


def chunk_view(kv_layer: torch.Tensor, block_size: int, fmt: PagedFormat = PagedFormat("CPU_ATTN")) -> torch.Tensor:
    """``[num_blocks, *chunk layer]`` over one layer's ``[B, H, N, C]`` view, without copying.

    A layer whose shape or strides the backend cannot have is refused: a wrong reading would load
    wrong KV without any error.
    """
    if kv_layer.dim() != 4 or kv_layer.shape[2] != block_size:
        raise ValueError(f"expected a {fmt.backend} KV layer [num_blocks, heads, {block_size}, content], got {list(kv_layer.shape)}")
    nb, heads, tokens, content = kv_layer.shape
    if fmt.content == "latent":
        if heads != 1:
            raise ValueError(f"an MLA KV layer ({fmt.backend}) has one head slot, got {heads}")
        return kv_layer[:, 0]                                                    # [B, N, C]
    if content % 2:
        raise ValueError(f"a {fmt.backend} KV layer's content must be 2·head_dim, got {content}")
    if fmt.content == "token_kv":
        return kv_layer.unflatten(3, (2, content // 2)).permute(0, 3, 2, 1, 4)  # [B, 2, N, H, D]
    # block_kv: a head's [N, 2D] block read as [2N, D], so N and C must be one dense run.
    s_b, s_h, s_n, s_c = kv_layer.stride()
    if s_c != 1 or s_n != content:
        raise ValueError(f"a {fmt.backend} KV layer needs dense [block_size, content] runs, got strides {kv_layer.stride()}")
    d = content // 2
    view = kv_layer.as_strided((nb, heads, 2, tokens, d), (s_b, s_h, tokens * d, d, 1))
    return view.permute(0, 2, 3, 1, 4)                                          # [B, 2, N, H, D]


def layout_of(views: list[torch.Tensor], fmt: PagedFormat = PagedFormat("CPU_ATTN")) -> KVLayout:
    """The :class:`KVLayout` of chunks made from these layer views (all alike)."""
    first = views[0]
    for v in views[1:]:
        if v.shape[1:] != first.shape[1:] or v.dtype != first.dtype:
            raise ValueError(f"KV layers differ: {list(v.shape)} {v.dtype} vs {list(first.shape)} {first.dtype}")
    if first.dtype not in DTYPES:
        raise ValueError(f"KV cache dtype {first.dtype} has no chunk dtype; supported: {', '.join(map(str, DTYPES))}")
    if fmt.content == "latent":
        _, tokens, latent = first.shape
        if latent % 2:
            raise ValueError(f"MLA latent dim {latent} is odd; its chunk layout needs it even")
        return KVLayout(num_layers=len(views), chunk_tokens=tokens, kv_heads=1, head_dim=latent // 2, dtype=DTYPES[first.dtype])
    _, _, tokens, heads, dim = first.shape
    return KVLayout(num_layers=len(views), chunk_tokens=tokens, kv_heads=heads, head_dim=dim, dtype=DTYPES[first.dtype])


def chunk_layer_shape(layout: KVLayout, fmt: PagedFormat = PagedFormat("CPU_ATTN")) -> tuple[int, ...]:
    """One chunk layer's shape: ``[2, N, H, D]``, or ``[N, latent]`` for MLA."""
    if fmt.content == "latent":
        return (layout.chunk_tokens, 2 * layout.head_dim)
    return (2, layout.chunk_tokens, layout.kv_heads, layout.head_dim)


def as_array(view: torch.Tensor) -> np.ndarray:
    """A host tensor view (any strides) as a numpy array over the same memory, its elements as same-width integers.

    A load's scatter copies through it on the SDK's thread: numpy's copy is that thread's own loop, where torch's ran
    on a second OpenMP team beside the engine's (more OpenMP threads than cores on a small host). Measured with the
    0.5B model (16-28 chunks of 28 layers, 2 cores): a load's scatters took 12-34 ms, against 41-77 ms through torch.
    """
    return view.view(WIDTHS[view.element_size()]).numpy()


def scatter_layer(dst: np.ndarray, payload: memoryview, blocks: np.ndarray, chunk_rows: np.ndarray | None) -> None:
    """One layer of a layer-major payload (its chunks in order) into the paged blocks ``blocks`` of ``dst`` (an
    :func:`as_array` of a :func:`chunk_view`); block ``blocks[j]`` takes chunk ``chunk_rows[j]`` (None: chunk ``j``)."""
    src = np.frombuffer(payload, dtype=dst.dtype).reshape(-1, *dst.shape[1:])
    dst[blocks] = src if chunk_rows is None else src[chunk_rows]
