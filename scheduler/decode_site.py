"""Where a compressed chunk is decoded for one transfer: in the node, or in the SDK on the engine's host (pure).

Chunks stored compressed reach the engine one of two ways (``fetch_layers(decode="node" | "client")``):

* **node** — the node decodes (``d_n = s / (D·w_n)`` per layer), then the link carries raw bytes (``s / r``);
* **client** — the link carries the stored bytes (``s / (k·r)``), then the SDK decodes (``d_c = s / (D·w_c)``).

Where the node holds decoded copies of a share ``f`` of the chunks (``compression.decoded_copies_bytes``), it
decodes only the rest: ``d_n·(1 − f)``; the client would get the stored bytes of all of them.

Both are pipelines over the layers followed by the engine's compute (:func:`.codec_choice.pipeline_stall`);
the site with the smaller modelled stall wins. Ties, an unknown rate or no SDK workers go to the node: the
client's decode runs on the engine's host, beside its compute — the interference ShadowServe avoids — so it
is used only when it is strictly faster.

```python
from scheduler.decode_site import DecodeSiteRequest, choose_decode_site
site = choose_decode_site(DecodeSiteRequest(rate, payload_bytes, num_layers, stored_profile, node_workers, client_workers)).site
```
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .codec_choice import RAW, CodecProfile, check_transfer, pipeline_stall


@dataclass(frozen=True)
class DecodeSiteRequest:
    """One transfer of chunks stored with ``stored``: the link rate between node and SDK (bytes/s; ``None``/0
    when unknown), raw payload bytes, layers, decode workers on each side and the engine's compute per layer."""

    link_bytes_per_s: float | None
    payload_bytes: float
    num_layers: int
    stored: CodecProfile
    node_workers: int
    client_workers: int
    compute_per_layer_s: float = 0.0
    # The client's own decode rate per core when it measured one (None: the same as ``stored``'s, the node's figure).
    client_decode_bytes_per_s_per_core: float | None = None
    # The share of the payload the node would read from decoded copies (nothing to decode) if it decoded.
    node_decoded_fraction: float = 0.0

    def __post_init__(self) -> None:
        check_transfer(self.num_layers, self.payload_bytes, self.compute_per_layer_s)
        if self.node_workers < 1:
            raise ValueError(f"node_workers must be at least 1 (the node always decodes what it serves raw), not {self.node_workers}")
        if self.client_workers < 0:
            raise ValueError(f"client_workers must be >= 0, not {self.client_workers}")
        if not 0.0 <= self.node_decoded_fraction <= 1.0:
            raise ValueError(f"node_decoded_fraction must be within 0..1, not {self.node_decoded_fraction}")


@dataclass(frozen=True)
class DecodeSite:
    site: str  # "node" or "client"
    node_stall_s: float
    client_stall_s: float
    reason: str


def choose_decode_site(req: DecodeSiteRequest) -> DecodeSite:
    r, p = req.link_bytes_per_s, req.stored
    if p.name == RAW or p.ratio <= 0 or not math.isfinite(p.ratio):
        return DecodeSite("node", math.nan, math.nan, "stored raw: nothing to decode")
    if r is None or not r > 0:
        return DecodeSite("node", math.nan, math.nan, "link rate unknown: the node decodes")
    if req.client_workers == 0 or not p.usable:
        return DecodeSite("node", math.nan, math.nan, "no client decode workers or no decode rate: the node decodes")
    per_layer = req.payload_bytes / req.num_layers
    theirs = req.client_decode_bytes_per_s_per_core
    client_rate = p.decode_bytes_per_s_per_core if theirs is None or not theirs > 0 or math.isnan(theirs) else theirs

    def d(decode: float, workers: int) -> float:
        return 0.0 if math.isinf(decode) else per_layer / (decode * workers)

    node_decode = d(p.decode_bytes_per_s_per_core, req.node_workers) * (1.0 - req.node_decoded_fraction)
    node = pipeline_stall([node_decode, per_layer / r], req.num_layers, req.compute_per_layer_s)
    client = pipeline_stall([per_layer / p.ratio / r, d(client_rate, req.client_workers)], req.num_layers, req.compute_per_layer_s)
    if client < node:
        return DecodeSite("client", node, client, f"client: {client:.4g}s vs node {node:.4g}s (fewer bytes on a slow link)")
    return DecodeSite("node", node, client, f"node: {node:.4g}s vs client {client:.4g}s")
