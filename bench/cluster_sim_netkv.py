"""NetKV's setting: which decode instance receives a prefilled request's KV, on a 64-GPU four-tier fat-tree.

2 pods × 2 racks × 2 servers × 8 GPUs; Llama-3-70B at TP=4 gives 16 instances,
one prefill instance per rack (4) and 12 decode instances. Per-transfer tier
bandwidths (four GPU flows in parallel): same server 300 GB/s (NVLink), same
rack 4×100 Gbps, same pod 4×25 Gbps (2:1), across pods 4×12.5 Gbps (4:1).
Racks and pods reach the next layer over two ECMP uplinks each (a transfer picks
one at random); every fabric link carries background load that changes every
second (uniform around the configured mean). A request is prefilled on the
least-busy prefill instance, then the policy picks its decode instance; its KV
(minus the prefix that instance already caches) crosses the fabric, it waits
for a decode slot and memory, and its first token comes after one decode step.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from scheduler import LinkView, OracleView, PathRequest, Source, SourceKind, Tier, choose_path
from scheduler.oracle import EngineClock, first_token_at

from .cluster_sim_models import BLOCK_TOKENS, KV_BYTES_PER_TOKEN_70B, Profile, Request, decode_step_s, percentile, prefill_s
from .cluster_sim_net import Clock, Fabric

GB = 1e9
INSTANCES = 16
PREFILL = (0, 1, 2, 3)  # the prefill pool fills rack 0 (NetKV: transfers cross tiers 2 and 3 only)
DECODE = tuple(i for i in range(INSTANCES) if i not in PREFILL)
STATIC_TIER_BW = {Tier.SAME_HOST: 300 * GB, Tier.SAME_RACK: 50 * GB, Tier.SAME_ZONE: 12.5 * GB}
TIER_LATENCY = {Tier.SAME_HOST: 2e-6, Tier.SAME_RACK: 5e-6, Tier.SAME_ZONE: 10e-6, Tier.CROSS_ZONE: 25e-6}
NIC_BW = 50 * GB  # 4 GPUs × 100 Gbps per instance
RACK_UPLINK_BW = 50 * GB  # per ECMP uplink: racks at 2:1 (2 × 50 GB/s for 200 GB/s of NICs)
MAX_BATCH = 64
DECODE_MEMORY = 180 * GB  # 4 × 45 GB of HBM free for KV
PREFIX_CACHE_BLOCKS = 1500  # per decode instance (HBM and host memory), LRU
REFRESH_S = 1.0  # the oracle's telemetry refresh
POLICIES = ("round-robin", "load-aware", "cache-aware", "cache+load-aware", "netkv-static", "netkv-full", "dualpath", "ours")


def tier_bandwidth(oversubscription: float) -> dict[Tier, float]:
    """Per-transfer bandwidth by tier; across pods it is the NIC's 4×100 Gbps over twice the pod oversubscription (4:1 → 4×12.5 Gbps)."""
    return {**STATIC_TIER_BW, Tier.CROSS_ZONE: NIC_BW / (2 * oversubscription)}


def tier(a: int, b: int) -> Tier:
    if a // 2 == b // 2:
        return Tier.SAME_HOST
    if a // 4 == b // 4:
        return Tier.SAME_RACK
    return Tier.SAME_ZONE if a // 8 == b // 8 else Tier.CROSS_ZONE


class Topology:
    """Link indices: NVLink per server, NIC up/down per instance, 2 ECMP up/down links per rack and per pod."""

    def __init__(self, oversubscription: float) -> None:
        caps: list[float] = []
        self.tier_bw = tier_bandwidth(oversubscription)
        self.groups: dict[str, list[int]] = {}
        self.tier_of_link: list[Tier] = []

        def add(name: str, n: int, cap: float, t: Tier) -> None:
            self.groups[name] = list(range(len(caps), len(caps) + n))
            caps.extend([cap] * n)
            self.tier_of_link.extend([t] * n)

        for s in range(INSTANCES // 2):
            add(f"nvlink{s}", 1, STATIC_TIER_BW[Tier.SAME_HOST], Tier.SAME_HOST)
        for i in range(INSTANCES):
            add(f"up{i}", 1, NIC_BW, Tier.SAME_RACK)
            add(f"down{i}", 1, NIC_BW, Tier.SAME_RACK)
        for r in range(4):
            add(f"rackup{r}", 2, RACK_UPLINK_BW, Tier.SAME_ZONE)
            add(f"rackdown{r}", 2, RACK_UPLINK_BW, Tier.SAME_ZONE)
        pod_uplink = 8 * NIC_BW / oversubscription / 2  # 8 instances' NICs over the oversubscription, 2 ECMP links
        for p in range(2):
            add(f"podup{p}", 2, pod_uplink, Tier.CROSS_ZONE)
            add(f"poddown{p}", 2, pod_uplink, Tier.CROSS_ZONE)
        self.nominal = caps
        self.fabric_links = [k for k, t in enumerate(self.tier_of_link) if t >= Tier.SAME_ZONE]

    def group_path(self, a: int, b: int) -> list[str]:
        """The link groups from instance a to b (an ECMP group stands for either of its links)."""
        t = tier(a, b)
        if t == Tier.SAME_HOST:
            return [f"nvlink{a // 2}"]
        path = [f"up{a}"]
        if t >= Tier.SAME_ZONE:
            path.append(f"rackup{a // 4}")
        if t == Tier.CROSS_ZONE:
            path += [f"podup{a // 8}", f"poddown{b // 8}"]
        if t >= Tier.SAME_ZONE:
            path.append(f"rackdown{b // 4}")
        return [*path, f"down{b}"]


@dataclass
class Decode:
    index: int
    batch: set = field(default_factory=set)
    waiting: list = field(default_factory=list)
    memory: float = 0.0  # reserved KV bytes (in transfer, waiting, running)
    tokens: int = 0  # unfinished tokens assigned (DualPath's tok_e)
    assigned: int = 0  # unfinished requests assigned (DualPath's seq_e)
    inbound: int = 0
    cache: OrderedDict = field(default_factory=OrderedDict)
    phase: float = 0.0

    def hit_blocks(self, blocks: tuple[int, ...]) -> int:
        k = 0
        for b in blocks:
            if b not in self.cache:
                break
            k += 1
        return k

    def remember(self, blocks: tuple[int, ...]) -> None:
        for b in blocks:
            self.cache[b] = None
            self.cache.move_to_end(b)
        while len(self.cache) > PREFIX_CACHE_BLOCKS:
            self.cache.popitem(last=False)

    def queue_estimate(self) -> float:
        """NetKV's queueing term: one iteration per request ahead of it beyond the free slots."""
        ahead = len(self.waiting) + self.inbound + 1 - (MAX_BATCH - len(self.batch))
        return max(ahead, 0) * decode_step_s(len(self.batch))


@dataclass
class Outcome:
    ttft: float
    transfer_s: float
    tier: Tier
    arrival: float


class NetKVSim:
    def __init__(self, requests: list[Request], profile: Profile, policy: str, background: float, seed: int,
                 warmup_s: float, cla_weight: float = 0.5, oversubscription: float = 4.0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}")
        self.requests, self.profile, self.policy = requests, profile, policy
        self.background, self.warmup_s, self.cla_weight = background, warmup_s, cla_weight
        self.rng = np.random.default_rng([seed, 1])  # tie-breaking
        self.bg_rng = np.random.default_rng([seed, 2])  # background load: the same for every policy
        self.topo = Topology(oversubscription)
        self.fabric = Fabric(list(self.topo.nominal))
        self.clock = Clock(self.fabric)
        self.bg = {k: 0.0 for k in self.topo.fabric_links}
        self.snapshot = {t: 0.0 for t in Tier}  # the oracle's per-tier congestion, refreshed every REFRESH_S
        self.snapshot_links: dict[str, float] = {}
        self.prefill_free = dict.fromkeys(PREFILL, 0.0)
        self.decodes = {d: Decode(d) for d in DECODE}
        self.self_flows: dict[tuple[int, Tier], int] = {}
        self.rr = itertools.cycle(DECODE)
        self.outcomes: list[Outcome] = []
        self.last_arrival = requests[-1].arrival if requests else 0.0

    # --- background load and telemetry -------------------------------------------------------
    def _background_tick(self, now: float) -> None:
        for k in self.topo.fabric_links:
            self.bg[k] = min(0.9, self.bg_rng.uniform(0, 2 * self.background)) if self.background > 0 else 0.0
            self.fabric.set_capacity(now, k, self.topo.nominal[k] * (1 - self.bg[k]))
        for t in (Tier.SAME_ZONE, Tier.CROSS_ZONE):
            links = [k for k in self.topo.fabric_links if self.topo.tier_of_link[k] == t]
            self.snapshot[t] = float(np.mean([self.bg[k] for k in links]))
        self.snapshot_links = {name: float(np.mean([self.bg.get(k, 0.0) for k in ks])) for name, ks in self.topo.groups.items()}
        if now < self.last_arrival + 60:
            self.clock.at(now + REFRESH_S, self._background_tick)

    # --- the request's life --------------------------------------------------------------------
    def run(self) -> list[Outcome]:
        self.clock.at(0.0, self._background_tick)
        for i, r in enumerate(self.requests):
            self.clock.at(r.arrival, lambda now, r=r, i=i: self._arrive(r, i, now))
        self.clock.run()
        return self.outcomes

    def _arrive(self, r: Request, i: int, now: float) -> None:
        p = min(PREFILL, key=lambda i: (max(self.prefill_free[i], now), i))
        start = max(self.prefill_free[p], now)
        self.prefill_free[p] = start + prefill_s(r.input_tokens)
        self.clock.at(self.prefill_free[p], lambda t: self._prefilled(r, i, p, t))

    def _prefilled(self, r: Request, i: int, p: int, now: float) -> None:
        kv = r.input_tokens * KV_BYTES_PER_TOKEN_70B
        d, plan = self._choose(r, p, kv, now)
        dec = self.decodes[d]
        dec.memory += kv
        dec.tokens += r.input_tokens + r.output_tokens
        dec.assigned += 1
        dec.inbound += 1
        hit = min(dec.hit_blocks(r.blocks) * BLOCK_TOKENS, r.input_tokens)
        if plan is None:
            plan = [(p, (r.input_tokens - hit) * KV_BYTES_PER_TOKEN_70B)]
        t_tier = tier(p, d)
        pending = [len(plan)]

        def landed(t: float, src: int) -> None:
            self.self_flows[(src, tier(src, d))] -= 1
            pending[0] -= 1
            if pending[0] == 0:
                dec.inbound -= 1
                dec.remember(r.blocks)
                self._enqueue(dec, r, kv, now, t_tier, t)

        for src, nbytes in plan:
            key = (src, tier(src, d))
            self.self_flows[key] = self.self_flows.get(key, 0) + 1
            links = [self._pick_ecmp(g, i) for g in self.topo.group_path(src, d)]
            t = tier(src, d)
            bg = float(np.mean([self.bg.get(k, 0.0) for k in links]))
            cap = self.topo.tier_bw[t] * (1 - bg) if t >= Tier.SAME_ZONE else math.inf
            self.fabric.add(now, tuple(links), nbytes, lambda tt, src=src: landed(tt, src), cap)

    def _pick_ecmp(self, group: str, request: int) -> int:
        """ECMP: a hash of the request and the hop picks the uplink (the same for a request under every policy)."""
        links = self.topo.groups[group]
        return links[zlib.crc32(f"{request}/{group}".encode()) % len(links)]

    def _enqueue(self, dec: Decode, r: Request, kv: float, t_prefilled: float, t_tier: Tier, now: float) -> None:
        dec.waiting.append((r, kv, t_prefilled, t_tier, now))
        self._admit(dec, now)

    def _admit(self, dec: Decode, now: float) -> None:
        while dec.waiting and len(dec.batch) < MAX_BATCH:
            r, kv, t_prefilled, t_tier, t_landed = dec.waiting.pop(0)
            step = decode_step_s(len(dec.batch) + 1)
            if dec.batch:  # join at the next iteration boundary
                residual = step - ((now - dec.phase) % step)
            else:
                residual, dec.phase = 0.0, now
            first_token = now + residual + step
            dec.batch.add(id(r))
            if r.arrival >= self.warmup_s and r.arrival <= self.last_arrival:
                self.outcomes.append(Outcome(first_token - r.arrival, t_landed - t_prefilled, t_tier, r.arrival))
            done = first_token + (r.output_tokens - 1) * decode_step_s(len(dec.batch))
            self.clock.at(done, lambda t, r=r, kv=kv: self._finish(dec, r, kv, t))

    def _finish(self, dec: Decode, r: Request, kv: float, now: float) -> None:
        dec.batch.discard(id(r))
        dec.memory -= kv
        dec.tokens -= r.input_tokens + r.output_tokens
        dec.assigned -= 1
        self._admit(dec, now)

    # --- the policies ----------------------------------------------------------------------------
    def _choose(self, r: Request, p: int, kv: float, now: float) -> tuple[int, list[tuple[int, float]] | None]:
        fits = [d for d in DECODE if self.decodes[d].memory + kv <= DECODE_MEMORY] or list(DECODE)
        hits = {d: min(self.decodes[d].hit_blocks(r.blocks) * BLOCK_TOKENS, r.input_tokens) for d in fits}
        load = {d: len(self.decodes[d].batch) + len(self.decodes[d].waiting) + self.decodes[d].inbound for d in fits}
        step = {d: decode_step_s(len(self.decodes[d].batch) + 1) for d in fits}
        rank = dict(zip(fits, self.rng.permutation(len(fits)).tolist()))  # ties broken at random, never by position
        pol = self.policy
        if pol == "round-robin":
            while (d := next(self.rr)) not in fits:
                pass
            return d, None
        if pol == "load-aware":
            return min(fits, key=lambda d: (load[d], rank[d])), None
        if pol == "cache-aware":
            return min(fits, key=lambda d: (-hits[d], load[d], rank[d])), None
        if pol == "cache+load-aware":
            w = self.cla_weight
            return min(fits, key=lambda d: (-(w * hits[d] / r.input_tokens - (1 - w) * load[d] / MAX_BATCH), rank[d])), None
        if pol == "dualpath":
            return self._dualpath(r, fits, rank), None
        if pol in ("netkv-static", "netkv-full"):
            def cost(d: int) -> float:
                t = tier(p, d)
                bw = self.topo.tier_bw[t]
                if pol == "netkv-full":
                    bw = bw * (1 - self.snapshot[t]) / (1 + min(self.self_flows.get((p, t), 0), 16))
                nbytes = (r.input_tokens - hits[d]) * KV_BYTES_PER_TOKEN_70B
                return TIER_LATENCY[t] + nbytes / bw + self.decodes[d].queue_estimate() + step[d]
            return min(fits, key=lambda d: (cost(d), rank[d])), None
        return self._ours(r, p, sorted(fits, key=rank.get), step, now)

    def _dualpath(self, r: Request, fits: list[int], rank: dict[int, int]) -> int:
        """DualPath's DE selection: avoid high-token engines (above 1.05× the mean after this one), then fewest requests."""
        decs = [self.decodes[d] for d in fits]
        z = 1.05 * (sum(x.tokens for x in decs) + r.input_tokens) / len(decs)
        low = [x for x in decs if x.tokens + r.input_tokens <= z]
        if low:
            return min(low, key=lambda x: (x.assigned, rank[x.index])).index
        return min(decs, key=lambda x: (x.tokens, rank[x.index])).index

    def _link_views(self) -> dict[str, LinkView]:
        """What a node knows: configured bandwidths, background as of the last refresh, its own flows' remaining bytes."""
        on_link = self.fabric.remaining_by_link()
        views = {}
        for name, ks in self.topo.groups.items():
            flows = tuple(rem for k in ks for rem in on_link.get(k, ()))
            views[name] = LinkView(name, sum(self.topo.nominal[k] for k in ks), tier=self.topo.tier_of_link[ks[0]],
                                   background=self.snapshot_links.get(name, 0.0), flows=flows)
        for t in Tier:  # a transfer's own port speed on each tier (its private cap)
            views[f"port{t.value}"] = LinkView(f"port{t.value}", self.topo.tier_bw[t], TIER_LATENCY[t], t,
                                               background=self.snapshot[t] if t >= Tier.SAME_ZONE else 0.0)
        return views

    def _ours(self, r: Request, p: int, fits: list[int], step: dict[int, float], now: float):
        """The path scheduler (scheduler.choose_path) per candidate: from the prefill instance, or split with the warmest peer."""
        links = self._link_views()
        blocks = math.ceil(r.input_tokens / BLOCK_TOKENS)
        chunk_bytes = BLOCK_TOKENS * KV_BYTES_PER_TOKEN_70B
        warm = {d: self.decodes[d].hit_blocks(r.blocks) for d in DECODE}
        best = None
        for d in fits:
            sources = [Source(f"prefill{p}", SourceKind.UPSTREAM, blocks, (*self.topo.group_path(p, d), f"port{tier(p, d).value}"))]
            peers = [q for q in DECODE if q != d and warm[q] > warm[d]]
            if peers:
                q = max(peers, key=lambda q: (warm[q], -tier(q, d), -q))
                sources.append(Source(f"peer{q}", SourceKind.PEER, warm[q], (*self.topo.group_path(q, d), f"port{tier(q, d).value}")))
            first = min(warm[d], blocks)
            # The last block is partial: the chunks to move carry their mean size, not a full block each.
            missing = max(r.input_tokens - first * BLOCK_TOKENS, 0) * KV_BYTES_PER_TOKEN_70B
            size = missing / (blocks - first) if blocks > first else chunk_bytes
            choice = choose_path(PathRequest(blocks, size, 80, first), OracleView(tuple(sources), links))
            dec = self.decodes[d]
            engine = EngineClock(step[d], dec.phase if dec.batch else None, now + dec.queue_estimate())
            cost = first_token_at(engine, now + choice.ttft_s, now) - now
            moved = sum(seg.end_chunk - seg.first_chunk for seg in choice.segments)
            # Equal predictions: the engine that moves fewer bytes (it holds more of the prefix) leaves the links to others.
            if best is None or cost < best[0] * (1 - 1e-9) or (cost <= best[0] * (1 + 1e-9) and moved < best[3]):
                best = (cost, d, choice, moved)
        _, d, choice, _ = best
        plan = []
        for seg in choice.segments:
            src = p if seg.source.startswith("prefill") else int(seg.source[4:])
            tokens = min(seg.end_chunk * BLOCK_TOKENS, r.input_tokens) - seg.first_chunk * BLOCK_TOKENS
            plan.append((src, max(tokens, 0) * KV_BYTES_PER_TOKEN_70B))
        return d, plan or [(p, 0.0)]


def summarise(outcomes: list[Outcome], slo_s: float, duration_s: float, fabric: Fabric, topo: Topology, end: float) -> dict:
    ttft = [o.ttft for o in outcomes]
    util = {}
    for t in Tier:
        ks = [k for k, lt in enumerate(topo.tier_of_link) if lt == t]
        util[t.name.lower()] = sum(fabric.busy_bytes[k] for k in ks) / (sum(topo.nominal[k] for k in ks) * max(end, 1e-9))
    share = {t.name.lower(): sum(1 for o in outcomes if o.tier == t) / max(len(outcomes), 1) for t in Tier}
    return {"requests": len(outcomes), "mean_ttft_s": float(np.mean(ttft)) if ttft else math.nan,
            "p50_ttft_s": percentile(ttft, 50), "p99_ttft_s": percentile(ttft, 99),
            "slo_attainment": sum(1 for x in ttft if x <= slo_s) / max(len(ttft), 1),
            "throughput_rps": len(outcomes) / duration_s, "goodput_rps": sum(1 for x in ttft if x <= slo_s) / duration_s,
            "mean_transfer_s": float(np.mean([o.transfer_s for o in outcomes])) if outcomes else math.nan,
            "tier_utilisation": util, "transfer_tier_share": share}


def simulate(requests: list[Request], profile: Profile, policy: str, background: float, seed: int, warmup_s: float,
             duration_s: float, cla_weight: float = 0.5, oversubscription: float = 4.0) -> dict:
    sim = NetKVSim(requests, profile, policy, background, seed, warmup_s, cla_weight, oversubscription)
    outcomes = sim.run()
    return summarise(outcomes, profile.slo_s, duration_s - warmup_s, sim.fabric, sim.topo, sim.fabric.now)


def capacity_rps(requests: list[Request]) -> float:
    """Requests per second the prefill pool can finish (mean prefill time over the workload's prompts)."""
    mean = float(np.mean([prefill_s(r.input_tokens) for r in requests]))
    return len(PREFILL) / mean
