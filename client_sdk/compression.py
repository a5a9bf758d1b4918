"""Compressed chunk objects from the SDK's side: a :class:`KVLayout`'s chunk encoded layer by layer.

``put_chunks(..., codec="zstd")`` stores each chunk as a compressed chunk object
(:mod:`protocol.compressed_chunk`); the node decodes it on every kv-get, so readers see the raw layers.
Lossy codecs are accepted only in buckets the node's ``[compression]`` configuration allows.
"""

from __future__ import annotations

from protocol.codecs import DTYPES, SliceLayout, codec_by_name
from protocol.compressed_chunk import HEADER_KV_LAYOUT, ChunkShape, encode_chunk

from .layout import KVLayout


def slice_layout(layout: KVLayout) -> SliceLayout:
    """One layer slice of a KV_L2TD chunk: keys then values, G tokens, n_kv·d channels."""
    if layout.dtype not in DTYPES:
        raise ValueError(f"compressed chunks need a float dtype ({', '.join(DTYPES)}), the layout's is {layout.dtype!r}")
    return SliceLayout(2, layout.chunk_tokens, layout.kv_heads * layout.head_dim)


def encode_layout_chunk(chunk: memoryview, layout: KVLayout, codec: str) -> bytes:
    """One raw chunk object (``L·S`` bytes) as a compressed chunk object."""
    s = layout.per_layer_chunk_bytes
    return encode_chunk([chunk[i * s : (i + 1) * s] for i in range(layout.num_layers)], codec_by_name(codec), layout.dtype,
                        slice_layout(layout))


def shape_header(layout: KVLayout) -> dict[str, str] | None:
    """The kv-put header stating the chunks' shape (float layouts only), so the node can apply the bucket's codec."""
    if layout.dtype not in DTYPES:
        return None
    return {HEADER_KV_LAYOUT: ChunkShape(layout.num_layers, layout.dtype, slice_layout(layout)).to_header()}
