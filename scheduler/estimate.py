"""A path choice as the ``kv-estimate`` answer for one candidate (the wire form lives in protocol.estimate)."""

from __future__ import annotations

from protocol.estimate import TIER_NAMES, CandidateEstimate, LinkInputs, PathSegment, WarmRun

from .paths import OracleView, PathChoice


def candidate_estimate(host: str, warm: dict[str, int], choice: PathChoice, view: OracleView) -> CandidateEstimate:
    """``warm``: node → leading chunks warm there (the asking tenant's only); links in path order, each once."""
    names: list[str] = []
    for seg in choice.segments:
        source = next(s for s in view.sources if s.name == seg.source)
        names += [link for link in source.links if link not in names]
    links = []
    for name in names:
        link = view.links[name]
        fresh = link.age_s <= view.stale_after_s
        bandwidth = link.measured_bytes_per_s if fresh and link.measured_bytes_per_s else link.capacity_bytes_per_s
        links.append(LinkInputs(name, TIER_NAMES[link.tier], float(bandwidth), float(link.background if fresh else 0.0), link.queued_bytes))
    return CandidateEstimate(host, [WarmRun(w, n) for w, n in sorted(warm.items()) if n > 0],
                             [PathSegment(s.source, s.first_chunk, s.end_chunk) for s in choice.segments],
                             choice.first_layer_s, choice.total_s, links)
