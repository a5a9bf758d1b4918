"""``kv-estimate``: the delivery-time oracle's question and answer, as JSON records.

A router asks ``POST /{bucket}?kv-estimate`` (signed like every KV operation) with
the prefix's chunk keys, the size of one chunk (all layers) and the layer count of
its model, and the destination hosts it is choosing between (a cluster node's
``host`` label or node id: the node beside the engine)::

    {"keys": ["<chunk key 0>", "<chunk key 1>", ...], "chunk_bytes": 8388608, "num_layers": 32,
     "candidates": ["gpu-7", "gpu-9"]}

The node
answers, per candidate, where the leading chunks are warm, the path it would use
and the predicted time to the first layer and to the whole payload, with the
inputs (tier, bandwidth, congestion, queued bytes of each link on the path) so a
router can fold them into its own score. Example answer::

    {"keys": 512, "chunk_bytes": 8388608, "num_layers": 32, "telemetry_age_s": 0.4,
     "candidates": [
       {"host": "gpu-7", "warm": [{"where": "node-a", "chunks": 512}, {"where": "node-b", "chunks": 200}],
        "path": [{"source": "peer:node-b", "first_chunk": 0, "end_chunk": 200},
                 {"source": "local", "first_chunk": 200, "end_chunk": 512}],
        "first_layer_s": 0.0041, "total_s": 0.128,
        "links": [{"name": "node-b->gpu-7", "tier": "same-rack", "bandwidth_bytes_per_s": 12500000000.0,
                   "congestion": 0.1, "queued_bytes": 0.0}]}]}

A tenant learns only about its own prefixes: ``warm`` counts chunks of the asking
tenant's bucket, never another's.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields

from .errors import ErrorCode, S3Error
from .kv_http import JsonRecord, KVOp
from .wire import MAX_KEY_BYTES, MAX_LAYERS

KV_ESTIMATE = KVOp.ESTIMATE  # the sub-resource: POST /{bucket}?kv-estimate
MAX_ESTIMATE_KEYS = 65536
MAX_ESTIMATE_CANDIDATES = 64
MAX_ESTIMATE_BODY = 16 << 20  # the request's JSON (65536 keys of a typical ~100 bytes fit several times)
MAX_CHUNK_BYTES = 1 << 40
MAX_HOST_CHARS = 253
TIER_NAMES = ("same-host", "same-rack", "same-zone", "cross-zone")  # scheduler.Tier 0..3


class _Record(JsonRecord):
    """A JsonRecord whose float fields accept JSON integers and whose list fields may hold records."""

    @classmethod
    def from_json(cls, obj: object):  # type: ignore[override]
        if isinstance(obj, dict):
            hints = typing.get_type_hints(cls)
            obj = dict(obj)
            for f in fields(cls):  # type: ignore[arg-type]
                if f.name not in obj:
                    continue
                typ, value = hints[f.name], obj[f.name]
                if typ is float and isinstance(value, int) and not isinstance(value, bool):
                    obj[f.name] = float(value)
                elif typing.get_origin(typ) is list and isinstance(value, list):
                    (inner,) = typing.get_args(typ)
                    if isinstance(inner, type) and issubclass(inner, JsonRecord):
                        obj[f.name] = [inner.from_json(v) for v in value]
        return super().from_json(obj)


@dataclass(frozen=True)
class EstimateRequest(_Record):
    keys: list[str]  # the prefix's chunk keys, in order
    candidates: list[str]  # destination hosts (engines' nodes) to estimate for
    chunk_bytes: int  # one chunk object, all layers (KVLayout.chunk_bytes)
    num_layers: int

    def check(self) -> "EstimateRequest":
        """Refuse empty, oversized or impossible questions (InvalidArgument naming the field)."""
        for name, items, limit in (("keys", self.keys, MAX_ESTIMATE_KEYS), ("candidates", self.candidates, MAX_ESTIMATE_CANDIDATES)):
            if not items or len(items) > limit:
                raise _bad(name, f"{name} must hold 1..{limit} entries, not {len(items)}")
        if any(not k or len(k.encode()) > MAX_KEY_BYTES for k in self.keys):
            raise _bad("keys", f"every key must be 1..{MAX_KEY_BYTES} bytes")
        if any(not h or len(h) > MAX_HOST_CHARS for h in self.candidates):
            raise _bad("candidates", f"every host must be 1..{MAX_HOST_CHARS} characters")
        if len(set(self.candidates)) != len(self.candidates):
            raise _bad("candidates", "candidates must not repeat a host")
        if not 1 <= self.chunk_bytes <= MAX_CHUNK_BYTES:
            raise _bad("chunk_bytes", f"chunk_bytes must be in 1..{MAX_CHUNK_BYTES}, not {self.chunk_bytes}")
        if not 1 <= self.num_layers <= MAX_LAYERS or self.chunk_bytes % self.num_layers:
            raise _bad("num_layers", f"num_layers must be in 1..{MAX_LAYERS} and divide chunk_bytes")
        return self


def _bad(name: str, message: str) -> S3Error:
    return S3Error(ErrorCode.InvalidArgument, message, extra={"ArgumentName": name})


@dataclass(frozen=True)
class WarmRun(_Record):
    where: str  # a node's name
    chunks: int  # how many leading chunks of the prefix are warm there


@dataclass(frozen=True)
class PathSegment(_Record):
    source: str  # "local", "peer:<node>" or "upstream@<node>"
    first_chunk: int
    end_chunk: int  # exclusive


@dataclass(frozen=True)
class LinkInputs(_Record):
    """The oracle's inputs for one link of the path, for a router to weigh with its own signals."""

    name: str
    tier: str  # one of TIER_NAMES
    bandwidth_bytes_per_s: float  # configured, or the measured EWMA when fresh
    congestion: float  # fraction of the link busy with traffic that is not ours
    queued_bytes: float  # our in-flight bytes on it


@dataclass(frozen=True)
class CandidateEstimate(_Record):
    host: str
    warm: list[WarmRun]
    path: list[PathSegment]
    first_layer_s: float
    total_s: float
    links: list[LinkInputs]


@dataclass(frozen=True)
class EstimateReply(_Record):
    keys: int
    chunk_bytes: int  # all layers of one chunk
    num_layers: int
    telemetry_age_s: float  # how old the congestion figures are
    candidates: list[CandidateEstimate]
