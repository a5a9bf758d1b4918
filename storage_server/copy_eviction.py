"""Which decoded copies make room for a new one (pure: no I/O, no locks; :mod:`storage_server.decoded_copies` applies it).

Copies come two ways: after a kv-get decoded a chunk (a *read* copy: a tenant's kv-get wanted it) and right after a
kv-put stored a compressed chunk (a *speculative* copy: decoded at nice 19 so that the chunk's first kv-get finds it
decoded; until a kv-get reads it, it is only a guess). The rules keep speculation from costing anyone a copy they use:

* a copy a transfer reads is never evicted;
* a read copy's fill evicts speculative copies first (least recently made first), then read copies, least recently
  used first: its own tenant's always, another tenant's only while that tenant would still hold at least the read
  bytes the filling tenant will (max-min fair: one tenant's kv-gets cannot push out every copy another tenant's
  kv-gets made; with one tenant this is the node-wide LRU the copies always had);
* a speculative fill never evicts a read copy. It evicts its own tenant's speculative copies first, then another
  tenant's only while that tenant would still hold more speculative bytes than the filling tenant (largest holder
  first): one tenant's burst of kv-puts cannot push out every other tenant's speculative copies.

None: no room within these rules (the fill is skipped; nothing is evicted).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Held:
    """One copy as eviction sees it (in least recently used order in the caller's list)."""

    ident: Hashable
    size: int
    tenant: str
    speculative: bool
    readers: int = 0


def victims(held: Sequence[Held], used: int, budget: int, room: int, tenant: str, speculative: bool) -> list[Hashable] | None:
    """The copies to evict (in order) so that ``room`` more bytes fit in ``budget`` (``used`` held now); None: they cannot."""
    if room > budget:
        return None
    need = used + room - budget
    if need <= 0:
        return []
    free = [h for h in held if h.readers == 0]
    out: list[Hashable] = []
    if not speculative:
        for h in free:  # guesses first, oldest first
            if need <= 0:
                return out
            if h.speculative:
                out.append(h.ident)
                need -= h.size
        reads: dict[str, int] = {}
        for h in held:
            if not h.speculative:
                reads[h.tenant] = reads.get(h.tenant, 0) + h.size
        mine = reads.get(tenant, 0) + room  # what the filler will hold
        left = [h for h in free if not h.speculative]
        while need > 0:  # then read copies, least recently used first, within the fair share
            for h in left:  # (a copy skipped may become fair once the filler's own have gone: passes until none is)
                if h.tenant == tenant or reads[h.tenant] - h.size >= mine:
                    break
            else:
                return None
            left.remove(h)
            out.append(h.ident)
            need -= h.size
            reads[h.tenant] -= h.size
            if h.tenant == tenant:
                mine -= h.size
        return out
    for h in free:  # its own guesses first, oldest first
        if need <= 0:
            break
        if h.speculative and h.tenant == tenant:
            out.append(h.ident)
            need -= h.size
    if need <= 0:
        return out
    mine = sum(h.size for h in held if h.speculative and h.tenant == tenant) - sum(h.size for h in held if h.ident in out) + room
    per_tenant: dict[str, int] = {}
    for h in held:
        if h.speculative and h.tenant != tenant:
            per_tenant[h.tenant] = per_tenant.get(h.tenant, 0) + h.size
    others = [h for h in free if h.speculative and h.tenant != tenant]
    while need > 0:
        richest = max((t for t in per_tenant if any(h.tenant == t for h in others)), key=lambda t: per_tenant[t], default=None)
        if richest is None:
            return None
        h = next(h for h in others if h.tenant == richest)
        if per_tenant[richest] - h.size < mine:  # it would hold less than the filler: fair share reached
            return None
        others.remove(h)
        out.append(h.ident)
        per_tenant[richest] -= h.size
        need -= h.size
    return out
