"""The node's per-kv-get decode site for ``decode="auto"`` (descriptor flag DECODE_AUTO): glue, no I/O.

A kv-get of chunks stored compressed can reach the engine two ways: the node decodes them (the link carries
raw bytes) or sends them as stored for the SDK to decode (the link carries the encoded bytes). The node knows
what the SDK does not — the chunks' codec and stored sizes, its own measured decode pipeline, the rate the
bandwidth pool granted this transfer — and the SDK states its decode workers, its measured decode rate and the
link rate it declares; :func:`scheduler.decode_site.choose_decode_site` (the pure break-even model) decides.
An unknown link rate, or no decode figure yet, leaves the decode in the node (off the engine's host).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from protocol.compressed_chunk import SLICE_HEAD, ChunkHeader
from protocol.packed_layer import fits
from protocol.wire import Descriptor, TransportKind
from scheduler.codec_choice import CodecProfile
from scheduler.decode_site import DecodeSite, DecodeSiteRequest, choose_decode_site

if TYPE_CHECKING:
    from .read_plan import ReadPlan


def wire_layer_bytes(headers: Sequence[ChunkHeader | None], layer: int, s: int) -> int:
    """Bytes one layer puts on the link as ENCODED frames (each slice's header, then its bytes as stored)."""
    return sum(SLICE_HEAD.size + (s if h is None else h.lengths[layer]) for h in headers)


def node_decode_figures(status: Mapping[str, Mapping[str, float]]) -> tuple[float, float]:
    """From the decode pipeline's stage meters: (decoded bytes/s per core doing both stages in turn, as one SDK
    thread does; bytes/s of the whole pipeline, its slowest stage on its workers). (0, 0) before any decode."""
    stages = [status.get("decompress", {}), status.get("dequantise", {})]
    busy = sum(float(st.get("busy_s", 0.0)) for st in stages)
    nbytes = float(stages[0].get("bytes", 0))
    if busy <= 0 or nbytes <= 0:
        return 0.0, 0.0
    rates = [float(st["bytes"]) / float(st["busy_s"]) * int(st.get("workers", 1)) for st in stages if float(st.get("busy_s", 0)) > 0]
    return nbytes / busy, min(rates)


def choose_site(d: Descriptor, headers: Sequence[ChunkHeader | None], granted_bytes_per_s: float | None,
                pipeline_status: Mapping[str, Mapping[str, float]], compute_per_layer_s: float, copied: int = 0) -> DecodeSite:
    """Where this DECODE_AUTO kv-get's compressed chunks are decoded. The link rate: the pool's grant when the
    transfer is paced, else the rate the client declared (0: unknown); ``copied``: how many of them the node holds
    decoded copies of (it would not decode those)."""
    s = d.per_layer_chunk_bytes
    wire = sum(wire_layer_bytes(headers, layer, s) for layer in range(d.num_layers))
    per_core, pipeline = node_decode_figures(pipeline_status)
    if per_core <= 0:
        per_core = d.client_decode_bytes_per_s
    node_workers = max(1, round(pipeline / per_core)) if pipeline > 0 and per_core > 0 else 1
    rate = granted_bytes_per_s if granted_bytes_per_s else (d.client_link_bytes_per_s or None)
    stored = CodecProfile("stored", d.payload_bytes / wire if wire else 1.0, per_core if per_core > 0 else float("nan"))
    compressed = sum(h is not None for h in headers)
    return choose_decode_site(DecodeSiteRequest(rate, d.payload_bytes, d.num_layers, stored, node_workers, d.client_decode_workers,
                                                compute_per_layer_s, d.client_decode_bytes_per_s or None,
                                                copied / compressed if compressed else 0.0))


def decode_site(d: Descriptor, reads: "ReadPlan", granted_bytes_per_s: float | None, pipeline_status: Mapping[str, Mapping[str, float]],
                compute_per_layer_s: float, copied: int = 0) -> dict[str, Any]:
    """A kv-get of chunks stored compressed: decode in the node or send them as stored (sets ``reads.send_encoded``),
    by the break-even model over the pool's grant (or the client's declared rate) and the measured decoders; what
    the END frame reports as ``decode_site`` (empty when every chunk is raw)."""
    if reads.headers is None:
        return {}
    if not (d.decode_auto or d.client_decodes):
        return {"site": "node", "reason": "decode='node' (shm always)", "wire_bytes": d.payload_bytes}
    s = d.per_layer_chunk_bytes
    per_layer = [wire_layer_bytes(reads.headers, layer, s) for layer in range(d.num_layers)]
    wire = sum(per_layer)
    if d.target.transport == TransportKind.RDMA and not all(fits(w, len(reads.headers), s) for w in per_layer):
        reads.send_encoded = False  # over rdma the slices go packed into each layer's raw place (protocol.packed_layer)
        return {"site": "node", "reason": "rdma: a layer's slices as stored do not fit in its raw place", "wire_bytes": d.payload_bytes}
    if d.client_decodes:
        return {"site": "client", "reason": "the client asked (decode='client')", "wire_bytes": wire}
    choice = choose_site(d, reads.headers, granted_bytes_per_s, pipeline_status, compute_per_layer_s, copied)
    reads.send_encoded = choice.site == "client"
    return {"site": choice.site, "reason": choice.reason, "wire_bytes": wire if reads.send_encoded else d.payload_bytes}
