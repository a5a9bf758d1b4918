"""``kv-estimate``: the delivery-time oracle's question and answer, as JSON records.

A router asks ``POST /{bucket}?kv-estimate`` (signed like every KV operation) with
the prefix's chunk keys and the destination hosts it is choosing between; the node
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
from .kv_http import JsonRecord

KV_ESTIMATE = "kv-estimate"  # the sub-resource: POST /{bucket}?kv-estimate
MAX_ESTIMATE_KEYS = 65536
MAX_ESTIMATE_CANDIDATES = 64
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

    def check(self) -> "EstimateRequest":
        """Refuse empty or oversized questions (InvalidArgument naming the field)."""
        for name, items, limit in (("keys", self.keys, MAX_ESTIMATE_KEYS), ("candidates", self.candidates, MAX_ESTIMATE_CANDIDATES)):
            if not items or len(items) > limit:
                raise S3Error(ErrorCode.InvalidArgument, f"{name} must hold 1..{limit} entries, not {len(items)}", extra={"ArgumentName": name})
        if len(set(self.candidates)) != len(self.candidates):
            raise S3Error(ErrorCode.InvalidArgument, "candidates must not repeat a host", extra={"ArgumentName": "candidates"})
        return self


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
