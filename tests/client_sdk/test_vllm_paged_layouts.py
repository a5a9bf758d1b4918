"""vLLM's GPU paged KV layouts ↔ chunk layers, checked on CPU tensors against vLLM's own layout maths.

The paged caches here are made by vLLM itself: ``compute_layout_strides`` and
``create_kv_cache_views`` (what vLLM's model runner hands a connector) over one flat byte buffer,
for every :class:`KVCacheLayout` stride order and every backend the connector knows. The
reference reads and writes that buffer by byte offsets from vLLM's strides and each backend's
content rule (numpy index arithmetic, no torch views), independently of
:func:`client_sdk.vllm_connector.blocks.chunk_view`. Block tables are random (hypothesis), with
shared blocks (one chunk scattered into several blocks; one block gathered for several chunks) and
partial transfers (a few blocks of one layer: every other byte must stay as it was).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install 'objectcache[vllm]'; make test does)")

torch = pytest.importorskip("torch")
kvi = pytest.importorskip("vllm.v1.kv_cache_interface")
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

from client_sdk.vllm_connector.blocks import CONTENT, LAYOUTS, PagedFormat, as_array, chunk_layer_shape, chunk_view, layout_of, scatter_layer  # noqa: E402

ES = 4  # float32
NUM_LAYERS = 3
CASES = [(b, lay) for b in ("FLASH_ATTN", "FLASHINFER", "FLASHMLA", "CUTLASS_MLA") for lay in LAYOUTS] + [("CPU_ATTN", "LBHNC")]


def _spec(fmt: PagedFormat, block_size: int, heads: int, dim: int):
    if fmt.content == "latent":
        return kvi.MLAAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=2 * dim, dtype=torch.float32)
    return kvi.FullAttentionSpec(block_size=block_size, num_kv_heads=heads, head_size=dim, dtype=torch.float32)


class Paged:
    """One group of layers laid out by vLLM: the raw buffer, vLLM's per-layer views and byte strides."""

    def __init__(self, fmt: PagedFormat, num_blocks: int, block_size: int, heads: int, dim: int, seed: int) -> None:
        self.fmt, self.n, self.h, self.d = fmt, block_size, heads, dim
        spec = _spec(fmt, block_size, heads, dim)
        layout = KVCacheLayout[fmt.layout]
        self.strides = kvi.compute_layout_strides(spec, num_blocks, NUM_LAYERS, layout)  # bytes, [L, B, H, N, C]
        size = spec.page_size_bytes * num_blocks * NUM_LAYERS
        self.raw = torch.zeros(size, dtype=torch.int8)
        self.raw.view(torch.float32).copy_(torch.from_numpy(np.random.default_rng(seed).standard_normal(size // ES, dtype=np.float32)))
        tensor = kvi.KVCacheTensor(size=size, layers=[f"l{i}" for i in range(NUM_LAYERS)], layer_stride=self.strides[0],
                                   block_stride=self.strides[1])
        self.views = kvi.create_kv_cache_views(self.raw, spec, num_blocks, layout, tensor)

    def offsets(self, layer: int, blocks: np.ndarray) -> np.ndarray:
        """float32 index into ``raw`` of every element of ``blocks``' chunk layers: ``[len(blocks), *chunk layer]``."""
        s_l, s_b, s_h, s_n, _ = self.strides
        base = layer * s_l + blocks.reshape(-1, 1, 1, 1, 1) * s_b
        if self.fmt.content == "latent":            # [N, C]: token t's latent at t·s_N
            t = np.arange(self.n).reshape(1, -1, 1)
            c = np.arange(2 * self.d).reshape(1, 1, -1)
            return (base.reshape(-1, 1, 1) + t * s_n + c * ES) // ES
        k = np.arange(2).reshape(1, 2, 1, 1, 1)
        t = np.arange(self.n).reshape(1, 1, -1, 1, 1)
        h = np.arange(self.h).reshape(1, 1, 1, -1, 1)
        d = np.arange(self.d).reshape(1, 1, 1, 1, -1)
        if self.fmt.content == "token_kv":          # C = K|V of one token: element k·D + d
            return (base + h * s_h + t * s_n + (k * self.d + d) * ES) // ES
        # block_kv (CPU): a head's [N, 2D] run read as [2N, D]: row k·N + t
        return (base + h * s_h + ((k * self.n + t) * self.d + d) * ES) // ES


def _block_tables(draw, num_blocks: int) -> tuple[list[int], list[int]]:
    n = draw(st.integers(1, num_blocks))
    blocks = draw(st.lists(st.integers(0, num_blocks - 1), min_size=n, max_size=n, unique=True))
    chunk_index = draw(st.lists(st.integers(0, n - 1), min_size=n, max_size=n))  # repeats: one chunk feeds several blocks
    return blocks, chunk_index


@st.composite
def problems(draw):
    backend, layout = draw(st.sampled_from(CASES))
    num_blocks = draw(st.integers(1, 9))
    blocks, chunk_index = _block_tables(draw, num_blocks)
    shape = dict(block_size=draw(st.sampled_from([1, 2, 4, 16])), heads=draw(st.integers(1, 3)), dim=draw(st.sampled_from([1, 2, 8])))
    gather = draw(st.lists(st.integers(0, num_blocks - 1), min_size=1, max_size=12))  # repeats: one block gathered for several chunks
    return PagedFormat(backend, layout), num_blocks, shape, blocks, chunk_index, gather, draw(st.integers(0, 2**31))


@settings(max_examples=120, deadline=None)
@given(problems())
def test_gather_and_scatter_match_vllms_own_layout(problem):
    fmt, num_blocks, shape, blocks, chunk_index, gather, seed = problem
    paged = Paged(fmt, num_blocks, shape["block_size"], shape["heads"], shape["dim"], seed)
    flat = paged.raw.view(torch.float32).numpy()
    views = [chunk_view(v, shape["block_size"], fmt) for v in paged.views]
    layout = layout_of(views, fmt)
    assert layout.per_layer_chunk_bytes == int(np.prod(chunk_layer_shape(layout, fmt))) * ES
    layer = seed % NUM_LAYERS

    # Gather (a save): chunk layers out of the blocks, shared blocks included.
    g = np.array(gather)
    got = views[layer][torch.tensor(gather)].numpy()
    assert np.array_equal(got, flat[paged.offsets(layer, g)])

    # Scatter (a load): chunks from a layer-major payload into blocks; one chunk may feed several blocks. Through torch
    # views (a save's reading of them) and through the numpy arrays the connector's loads write.
    for how in ("torch", "array"):
        before = flat.copy()
        src_np = np.random.default_rng(seed + len(how)).standard_normal((len(blocks), *chunk_layer_shape(layout, fmt)), dtype=np.float32)
        payload = memoryview(bytearray(src_np.tobytes()))
        if how == "torch":
            src = torch.frombuffer(payload, dtype=torch.float32).view(len(blocks), *chunk_layer_shape(layout, fmt))
            views[layer][torch.tensor(blocks)] = src[torch.tensor(chunk_index)]
        else:
            identity = chunk_index == list(range(len(blocks)))
            scatter_layer(as_array(views[layer]), payload, np.array(blocks), None if identity else np.array(chunk_index))
        expected = before.copy()
        expected[paged.offsets(layer, np.array(blocks))] = src_np[np.array(chunk_index)]
        assert np.array_equal(flat, expected), f"the scatter ({how}) wrote other bytes than vLLM's layout says (or missed some)"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.uint8])
@pytest.mark.parametrize("backend", ["CPU_ATTN", "FLASH_ATTN", "FLASHMLA"])
def test_a_loads_scatter_through_arrays_writes_what_torch_would_for_every_element_width(dtype, backend):
    """The connector's loads scatter through :func:`as_array` (same-width integers: numpy has no bfloat16); over strided
    views of every element width it writes exactly the bytes torch's own scatter writes, one chunk feeding two blocks."""
    fmt = PagedFormat(backend)
    heads = 1 if fmt.content == "latent" else 2
    gen = torch.Generator().manual_seed(7)
    kv = (torch.rand((6, heads, 4, 8), generator=gen) * 100).to(dtype)  # [B, H, N, C]: 6 blocks of 4 tokens
    layout = layout_of([chunk_view(kv, 4, fmt)], fmt)
    src = (torch.rand((3, *chunk_layer_shape(layout, fmt)), generator=gen) * 100).to(dtype)
    blocks, rows = [5, 0, 3, 2], [2, 0, 1, 2]  # block 2 and block 5 both take chunk 2
    by_torch, by_array = kv.clone(), kv.clone()
    chunk_view(by_torch, 4, fmt)[torch.tensor(blocks)] = src[torch.tensor(rows)]
    scatter_layer(as_array(chunk_view(by_array, 4, fmt)), memoryview(src.view(torch.uint8).numpy().tobytes()), np.array(blocks), np.array(rows))
    assert torch.equal(by_array.view(torch.uint8), by_torch.view(torch.uint8))
    assert not torch.equal(by_array.view(torch.uint8), kv.view(torch.uint8))  # it wrote something


def test_the_known_layouts_and_backends_are_vllms():
    """A vLLM that adds a stride order or renames a backend fails here, not silently in a load."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    assert set(LAYOUTS) == {m.name for m in KVCacheLayout}
    assert set(CONTENT) <= {m.name for m in AttentionBackendEnum}
    assert CPUAttentionBackend.get_name() == "CPU_ATTN" and CPUAttentionBackend.supported_kv_cache_layouts() == (KVCacheLayout.LBHNC,)


@pytest.mark.parametrize("backend", ["TRITON_ATTN", "FLEX_ATTENTION", "ROCM_ATTN", "NO_SUCH_BACKEND"])
def test_an_unknown_backend_is_refused_by_name(backend):
    with pytest.raises(ValueError, match=backend):
        PagedFormat(backend)


def test_layers_the_backend_cannot_have_are_refused():
    with pytest.raises(ValueError, match="LBHNC"):
        PagedFormat("CPU_ATTN", "BLNHC")
    with pytest.raises(ValueError, match="not known"):
        PagedFormat("FLASH_ATTN", "NHD")
    mla = Paged(PagedFormat("FLASHMLA"), 2, 4, 1, 4, 0)
    with pytest.raises(ValueError, match="one head slot"):
        chunk_view(mla.views[0].expand(2, 2, 4, 8), 4, PagedFormat("FLASHMLA"))
    cpu = torch.zeros(2, 2, 4, 8).transpose(1, 2).contiguous().transpose(1, 2)  # N, C not one dense run
    with pytest.raises(ValueError, match="dense"):
        chunk_view(cpu, 4, PagedFormat("CPU_ATTN"))
