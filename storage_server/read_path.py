"""Dual-Blade's read-path planner: which layers of a cold transfer go through the page cache and which past it.

Under a tight memory budget the page cache thrashes: a cold prefix read through it evicts
what the next read needs, and read-ahead past the budget is wasted work. Dual-Blade
(§IV-A) estimates the page cache the node can use,

    M* = min(MemAvailable, cgroup limit − (anon + shmem of the cgroup))        (eq. 1)
    B_pc = max(0, M* − reserved)                                              (eq. 2)

and gives layers 0..n₁−1 the page-cache path, n₁ = min(⌊X / layer bytes⌋, L) for the X
bytes admitted, and the rest the direct path (O_DIRECT: no copy through the cache, a
deep queue, nothing evicted). The first layers are the ones an engine waits for first,
so they get the path that a warm fetch of the same prefix will hit next time.

Pure decisions here (``page_cache_budget``, ``plan_read_path``) and one reader of the
memory facts (``read_memory_facts``: /proc/meminfo and the process's own memory cgroup,
v1 or v2). :class:`storage_server.memory_budget.MemoryBudget` shares B_pc between all
concurrent transfers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from protocol.config import READ_PATHS


@dataclass(frozen=True)
class MemoryFacts:
    available: int | None  # MemAvailable (bytes), None if unknown
    cgroup_limit: int | None = None  # the process's memory cgroup limit, None if unlimited or unknown
    cgroup_unreclaimable: int = 0  # anon + shmem charged to that cgroup


@dataclass(frozen=True)
class ReadPath:
    page_cache_layers: int  # n₁: layers 0..n₁−1 read through the page cache
    direct: bool  # layers n₁..L−1 read with O_DIRECT (else through the page cache too)
    read_ahead_bytes: int  # bytes of the page-cache layers asked ahead (within the budget granted)


def page_cache_budget(facts: MemoryFacts, reserved: int = 0) -> int:
    """B_pc (Dual-Blade eq. 1–2): the page cache this node can use, less ``reserved`` (staging it holds itself)."""
    room = [v for v in (facts.available,) if v is not None]
    if facts.cgroup_limit is not None:
        room.append(facts.cgroup_limit - facts.cgroup_unreclaimable)
    return max(0, min(room) - reserved) if room else 0


def plan_read_path(policy: str, *, num_layers: int, layer_bytes: int, resident: float, cold_fraction: float,
                   granted: int, direct_possible: bool) -> ReadPath:
    """The read path of one transfer from its numbers.

    ``layer_bytes``: one layer of every chunk (N·S); ``resident``: the sampled share of its chunks
    already in the page cache; ``granted``: page-cache bytes the shared budget gave it;
    ``direct_possible``: O_DIRECT can land in its destination (layerwise, aligned, a filesystem
    that allows it). A warm transfer, or one that cannot read direct, reads through the page
    cache with read-ahead within the grant. Cold: ``page-cache`` reads every layer through it,
    ``direct`` none, ``planner`` the first n₁ = min(⌊granted / layer_bytes⌋, L).
    """
    total = num_layers * layer_bytes
    ahead = 0 if resident >= 1.0 else min(granted, total)
    if not direct_possible or resident > cold_fraction or policy == "page-cache":
        return ReadPath(num_layers, False, ahead)
    if policy == "direct":
        return ReadPath(0, True, 0)
    if policy != "planner":
        raise ValueError(f"storage_server.read_path: unknown {policy!r} (supported: {', '.join(READ_PATHS)})")
    n1 = min(num_layers, granted // layer_bytes) if layer_bytes > 0 else num_layers
    return ReadPath(n1, n1 < num_layers, n1 * layer_bytes)


# Bytes of page-cache layers asked ahead of the layer being read (storage_server.read_ahead_window_bytes's default).
READ_AHEAD_WINDOW_BYTES = 8 << 20


def read_ahead_window(layer_bytes: int, page_cache_layers: int, window_bytes: int, layerwise: bool) -> int:
    """Page-cache layers in flight at once: the one being read and those asked ahead of it, at least ``window_bytes``
    (two layers at least, so the next layer's reads overlap this one's copy). 0: every page-cache layer at once, as a
    chunkwise transfer reads (every layer is read together) or when ``window_bytes`` is 0.

    Asked all at once, n₁ layers of read-ahead went to the disk beside the first layer's own reads: measured at
    0.5× and 1× of the payload (64 and 124 MiB ahead in a 64 / 128 MiB budget) the first layer took 14 % and 44 %
    longer than direct's, the cgroup reclaiming while layer 0 read at 1×."""
    if not layerwise or window_bytes <= 0 or layer_bytes <= 0 or page_cache_layers <= 0:
        return 0
    return min(page_cache_layers, max(2, -(-window_bytes // layer_bytes)))


def read_ahead_frontier(layer: int, page_cache_layers: int, window: int) -> int:
    """How many of the page-cache layers (0..n₁−1) are to be asked ahead once ``layer`` is about to be read.

    Layer 0 alone first: it is what an engine waits for, and nothing else is queued on the disk beside it; from
    layer 1 on, ``window`` layers from the one being read (``window`` 0: all n₁ from the start)."""
    if window <= 0:
        return page_cache_layers
    if layer <= 0:
        return min(1, page_cache_layers)
    return min(page_cache_layers, layer + window)


def wanted_bytes(policy: str, num_layers: int, layer_bytes: int, resident: float, cold_fraction: float, direct_possible: bool) -> int:
    """What a transfer asks of the shared budget: its cold bytes (none when warm or reading direct only)."""
    if resident >= 1.0 or (policy == "direct" and direct_possible and resident <= cold_fraction):
        return 0
    return num_layers * layer_bytes


# -- the facts (I/O) ---------------------------------------------------------------


def _int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except (OSError, ValueError):
        return None
    return int(text) if text.isdigit() else None


def _stat(path: Path, *names: str) -> int:
    """The sum of ``names`` in a memory.stat file (0 for those absent)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0
    values = dict(line.split(maxsplit=1) for line in lines if " " in line)
    return sum(int(values[n]) for n in names if n in values and values[n].strip().isdigit())


def _meminfo_available(root: Path) -> int | None:
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _own_cgroups(root: Path) -> tuple[str | None, str | None]:
    """This process's v2 cgroup path and its v1 memory cgroup path (from /proc/self/cgroup)."""
    v2 = v1 = None
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _mounted(mount: Path, path: str, leaf: str) -> Path | None:
    """Where ``path`` (as /proc/self/cgroup names it) is under ``mount``: a container sees its own cgroup as the
    mount's root while /proc names the host's path, so leading parts are dropped until ``leaf`` exists."""
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts) + 1):
        base = mount.joinpath(*parts[i:])
        if (base / leaf).exists():
            return base
    return None


# v1 reports "no limit" as a huge page-rounded number: anything at or above this is no limit.
V1_UNLIMITED = 1 << 62


def read_memory_facts(root: Path = Path("/")) -> MemoryFacts:
    """MemAvailable and this process's memory cgroup limit and unreclaimable usage (cgroup v2, else v1)."""
    available = _meminfo_available(root)
    v2, v1 = _own_cgroups(root)
    if v2 is not None and (base := _mounted(root / "sys/fs/cgroup", v2, "memory.max")) is not None:
        limit = _int(base / "memory.max")  # "max" reads as None
        if limit is not None:
            return MemoryFacts(available, limit, _stat(base / "memory.stat", "anon", "shmem"))
    if v1 is not None and (base := _mounted(root / "sys/fs/cgroup/memory", v1, "memory.limit_in_bytes")) is not None:
        limit = _int(base / "memory.limit_in_bytes")
        if limit is not None and limit < V1_UNLIMITED:
            return MemoryFacts(available, limit, _stat(base / "memory.stat", "total_rss", "total_shmem")
                               or _stat(base / "memory.stat", "rss", "shmem"))
    return MemoryFacts(available)
