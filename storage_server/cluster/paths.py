"""A path choice as the fetcher's actions: the pure step between :func:`scheduler.paths.choose_path` and the I/O.

The fetcher plans in the space of the chunks its cache misses (``wanted``, in prefix order; a peer's warm
count is how many leading ``wanted`` chunks it holds). Each segment of a choice becomes one action:

* ``peer:<W>`` — stream the range from W's cache;
* ``upstream@<W>`` (W another node) — W fetches the range from the upstream through its own link and cache
  and streams it here (a *fill*: DualPath's second storage path);
* ``upstream@<me>`` — this node's own GETs;
* ``local`` — nothing to move (already pinned).

A choice can only use what the view offered, so these are all the sources there are (``direct:<W>`` is
answered with a ticket before any pin, :meth:`.fetcher.PeerFetcher.direct_grant`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from scheduler.paths import PathChoice


class Move(Enum):
    PEER = "peer"  # from the peer's cache
    FILL = "fill"  # through the peer's upstream link and cache
    OWN = "own"  # this node's upstream GETs
    DIRECT = "direct"  # the peer streams the whole kv-get to the engine


@dataclass(frozen=True)
class Action:
    move: Move
    node: str
    lo: int  # index into the missing chunks
    hi: int  # exclusive


def actions(choice: PathChoice, me: str) -> list[Action]:
    """The segments of ``choice`` as moves, in prefix order (``local`` segments move nothing)."""
    out = []
    for seg in choice.segments:
        kind, _, node = seg.source.partition(":") if ":" in seg.source else seg.source.partition("@")
        if seg.source == "local":
            continue
        if kind == "peer":
            move = Move.PEER
        elif kind == "direct":
            move = Move.DIRECT
        elif kind == "upstream":
            move = Move.OWN if node == me else Move.FILL
        else:
            raise ValueError(f"a path source the fetcher cannot take: {seg.source!r}")
        out.append(Action(move, node, seg.first_chunk, seg.end_chunk))
    return out


def runs(indices: list[int]) -> list[tuple[int, int]]:
    """Sorted indices as maximal ``[lo, hi)`` runs."""
    out: list[tuple[int, int]] = []
    for i in indices:
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out
