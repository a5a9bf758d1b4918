"""Pure scheduling decisions (no I/O): bandwidth allocation for layerwise KV loads, the delivery-time
oracle's cost model and the path scheduler.

```python
from scheduler import TransferDemand, allocate
rates = allocate("calibrated-stall-opt", demands, capacity=B, margin=delta)  # bytes/s, one per demand

from scheduler import OracleView, PathRequest, choose_path
choice = choose_path(PathRequest(num_chunks, chunk_bytes, num_layers), view)  # fastest path or split

from scheduler import CodecRequest, choose_codec
codec = choose_codec(CodecRequest(rate, payload_bytes, num_layers, workers, allow_lossy), profiles).codec  # raw or a codec

from scheduler import DecodeSiteRequest, choose_decode_site
site = choose_decode_site(DecodeSiteRequest(rate, payload_bytes, num_layers, stored, node_workers, client_workers)).site
```
"""

from .codec_choice import CodecChoice, CodecProfile, CodecRequest, break_even_rate, choose_codec, pipeline_stall
from .decode_site import DecodeSite, DecodeSiteRequest, choose_decode_site
from .oracle import DEFAULT_TIERS, LinkView, Placement, Tier, TierLink, estimate_path, ewma, ps_seconds, tier_between
from .paths import NoPath, OracleView, PathChoice, PathRequest, Segment, Source, SourceKind, choose_path, schedule_batch, with_choice
from .policies import POLICIES, TransferDemand, added_stall, allocate, objective, water_fill

__all__ = ["CodecChoice", "CodecProfile", "CodecRequest", "DEFAULT_TIERS", "DecodeSite", "DecodeSiteRequest", "POLICIES", "LinkView", "NoPath", "OracleView", "PathChoice", "PathRequest", "Placement", "Segment",
           "Source", "SourceKind", "Tier", "TierLink", "TransferDemand", "added_stall", "allocate", "break_even_rate", "choose_codec", "choose_decode_site", "choose_path", "estimate_path",
           "ewma", "objective", "pipeline_stall", "ps_seconds", "schedule_batch", "tier_between", "water_fill", "with_choice"]
