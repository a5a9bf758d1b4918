"""DualPath's setting: agentic offline batches whose hit KV is read from storage by the prefill or the decode side.

Nodes of 8 GPUs (one engine each): ``prefill_nodes`` of prefill engines (PEs)
and ``decode_nodes`` of decode engines (DEs). Every node has one 400 Gbps
storage NIC shared by its engines; every GPU a 400 Gbps compute NIC. A turn's
hit KV is read from storage either through its PE's node (the single-path
baseline) or through its DE's node and then over the compute network to the PE
(DualPath's second path); a split reads the front on one side and the rest on
the other. Each agent's starting context is already in storage (a resumed
trajectory), so every turn but the newest tokens hits. After prefill (DeepSeek-V3.2-class, one GPU) the turn's KV moves to
its DE, decode runs at a fixed time per token, the new tokens are written back
through the DE's storage NIC, and the agent's next turn starts. All agents
start at once; the job ends when the last turn is done.

Engines are picked as DualPath does (PE: shortest disk queue first, fewest
unfinished tokens; DE: fewest unfinished tokens) for every policy, so the
policies differ only in the read path: ``single-path`` (always the PE side),
``dualpath`` (the side whose storage NIC has less queued, DualPath §6.1) and
``ours`` (``scheduler.choose_path`` over both sides and their split).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from scheduler import LinkView, OracleView, PathRequest, Source, SourceKind, choose_path

from .cluster_sim_models import BLOCK_TOKENS, KV_BYTES_PER_TOKEN_DS, ds_prefill_s, percentile
from .cluster_sim_net import Clock, Fabric

GB = 1e9
GPUS = 8
SNIC_BW = 50 * GB
CNIC_BW = 50 * GB
TPOT_S = 0.02
POLICIES = ("single-path", "dualpath", "ours")
READ_CHUNK_TOKENS = 8192  # the split's granularity
ALPHA_S = 3.0  # DualPath's short-read-queue threshold: what a node reads in 3 s


@dataclass
class Turn:
    session: int
    input_tokens: int
    output_tokens: int
    blocks: tuple[int, ...]
    submitted: float = 0.0


@dataclass
class Engine:
    index: int
    node: int
    tokens: int = 0
    queue: deque = field(default_factory=deque)
    free_at: float = 0.0  # when the compute queued so far will be done
    running: bool = False
    reading_s: float = 0.0  # compute of its turns still reading their KV (queued ahead of a turn that starts reading now)


class DualPathSim:
    def __init__(self, records: list[dict], policy: str, prefill_nodes: int, decode_nodes: int) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}")
        self.policy = policy
        self.nodes = prefill_nodes + decode_nodes
        # links: storage NIC per node, then compute NIC per engine (PEs first)
        self.pes = [Engine(i, i // GPUS) for i in range(prefill_nodes * GPUS)]
        self.des = [Engine(i, prefill_nodes + i // GPUS) for i in range(decode_nodes * GPUS)]
        self.snic = list(range(self.nodes))
        self.cnic_pe = [self.nodes + i for i in range(len(self.pes))]
        self.cnic_de = [self.nodes + len(self.pes) + i for i in range(len(self.des))]
        self.fabric = Fabric([SNIC_BW] * self.nodes + [CNIC_BW] * (len(self.pes) + len(self.des)))
        self.clock = Clock(self.fabric)
        self.sessions: dict[int, deque[Turn]] = {}
        for r in records:
            sid = int(r.get("session", r["hash_ids"][0] if r["hash_ids"] else -1))
            self.sessions.setdefault(sid, deque()).append(
                Turn(sid, int(r["input_length"]), max(int(r.get("output_length", 1)), 1), tuple(r["hash_ids"])))
        self.stored: set[int] = {b for turns in self.sessions.values() if turns for b in turns[0].blocks}
        self.ttft: list[float] = []
        self.tokens_done = 0
        self.read_bytes = [0.0] * self.nodes
        self.end = 0.0

    def run(self) -> dict:
        for sid in self.sessions:
            self.clock.at(0.0, lambda now, sid=sid: self._next_turn(sid, now))
        self.end = self.clock.run()
        snic_util = [self.fabric.busy_bytes[k] / (SNIC_BW * self.end) for k in self.snic]
        return {"turns": len(self.ttft), "jct_s": self.end, "throughput_tokens_per_s": self.tokens_done / self.end,
                "mean_ttft_s": float(np.mean(self.ttft)), "p50_ttft_s": percentile(self.ttft, 50),
                "p99_ttft_s": percentile(self.ttft, 99),
                "storage_nic_utilisation": {"prefill_nodes": float(np.mean(snic_util[:len(self.pes) // GPUS])),
                                            "decode_nodes": float(np.mean(snic_util[len(self.pes) // GPUS:]))},
                "storage_nic_max_over_mean": float(max(self.read_bytes) / max(np.mean(self.read_bytes), 1e-9))}

    def _next_turn(self, sid: int, now: float) -> None:
        turns = self.sessions[sid]
        if not turns:
            return
        turn = turns.popleft()
        turn.submitted = now
        hit_blocks = 0
        for b in turn.blocks:
            if b not in self.stored:
                break
            hit_blocks += 1
        hit = min(hit_blocks * BLOCK_TOKENS, turn.input_tokens - 1)
        pe, de = self._pick_pe(now), min(self.des, key=lambda e: (e.tokens, e.index))
        pe.tokens += turn.input_tokens
        de.tokens += turn.input_tokens + turn.output_tokens
        parts = self._read_plan(hit, pe, de, now) if hit > 0 else []
        pending = [len(parts)]
        compute = ds_prefill_s(turn.input_tokens - hit, hit)
        pe.reading_s += compute

        def read_done(t: float) -> None:
            pending[0] -= 1
            if pending[0] == 0:
                pe.reading_s -= compute
                self._compute(pe, de, turn, hit, t)

        for node, links, nbytes in parts:
            self.read_bytes[node] += nbytes
            self.fabric.add(now, links, nbytes, read_done)
        if not parts:
            pe.reading_s -= compute
            self._compute(pe, de, turn, hit, now)

    def _pick_pe(self, now: float) -> Engine:
        """DualPath Algorithm 1 without the fetch loop: nodes with short disk queues first, then fewest unfinished tokens."""
        alpha = ALPHA_S * SNIC_BW
        queued = {n: self.fabric.queued_on(self.snic[n]) for n in {e.node for e in self.pes}}
        return min(self.pes, key=lambda e: (queued[e.node] > alpha, e.tokens, e.index))

    def _read_plan(self, hit: int, pe: Engine, de: Engine, now: float) -> list[tuple[int, tuple[int, ...], float]]:
        nbytes = hit * KV_BYTES_PER_TOKEN_DS
        pe_path = (self.snic[pe.node], self.cnic_pe[pe.index])
        de_path = (self.snic[de.node], self.cnic_de[de.index - 0], self.cnic_pe[pe.index])
        if self.policy == "single-path":
            return [(pe.node, pe_path, nbytes)]
        if self.policy == "dualpath":
            q_pe = self.fabric.queued_on(self.snic[pe.node])
            q_de = self.fabric.queued_on(self.snic[de.node])
            return [(pe.node, pe_path, nbytes)] if q_pe <= q_de else [(de.node, de_path, nbytes)]
        names = {k: f"link{k}" for k in (*pe_path, *de_path)}
        links = {names[k]: LinkView(names[k], self.fabric.capacity[k], flows=tuple(self.fabric.remaining_on(k))) for k in names}
        chunks = math.ceil(hit / READ_CHUNK_TOKENS)
        sources = (Source("pe", SourceKind.LOCAL, chunks, tuple(names[k] for k in pe_path)),
                   Source("de", SourceKind.PEER, chunks, tuple(names[k] for k in de_path)))
        # The last chunk is partial: each chunk carries the mean size, so the prediction moves the bytes that are read.
        # The engine is busy with the compute queued and with the turns still reading for it (they land first).
        request = PathRequest(chunks, nbytes / chunks, 61, engine_busy_s=max(pe.free_at - now, 0.0) + max(pe.reading_s, 0.0))
        choice = choose_path(request, OracleView(sources, links))
        plan = []
        for seg in choice.segments:
            share = (seg.end_chunk - seg.first_chunk) / chunks
            node, path = (pe.node, pe_path) if seg.source == "pe" else (de.node, de_path)
            plan.append((node, path, nbytes * share))
        return plan

    def _compute(self, pe: Engine, de: Engine, turn: Turn, hit: int, now: float) -> None:
        pe.queue.append((de, turn, hit))
        pe.free_at = max(pe.free_at, now) + ds_prefill_s(turn.input_tokens - hit, hit)
        if not pe.running:
            self._start_next(pe, now)

    def _start_next(self, pe: Engine, now: float) -> None:
        if not pe.queue:
            pe.running = False
            return
        pe.running = True
        de, turn, hit = pe.queue.popleft()
        done = now + ds_prefill_s(turn.input_tokens - hit, hit)
        pe.free_at = max(pe.free_at, done)
        self.clock.at(done, lambda t: self._prefilled(pe, de, turn, hit, t))

    def _prefilled(self, pe: Engine, de: Engine, turn: Turn, hit: int, now: float) -> None:
        pe.tokens -= turn.input_tokens
        self._start_next(pe, now)
        # The new tokens' KV to the decode engine over the compute network (the hit part reached it as it was read).
        miss_bytes = (turn.input_tokens - hit) * KV_BYTES_PER_TOKEN_DS
        self.fabric.add(now, (self.cnic_pe[pe.index], self.cnic_de[de.index]), miss_bytes, lambda t: self._decode(de, turn, t))

    def _decode(self, de: Engine, turn: Turn, now: float) -> None:
        first = now + TPOT_S
        self.ttft.append(first - turn.submitted)
        done = first + (turn.output_tokens - 1) * TPOT_S
        self.clock.at(done, lambda t: self._finish(de, turn, t))

    def _finish(self, de: Engine, turn: Turn, now: float) -> None:
        de.tokens -= turn.input_tokens + turn.output_tokens
        self.tokens_done += turn.input_tokens + turn.output_tokens
        new = [b for b in turn.blocks if b not in self.stored]
        self.stored.update(turn.blocks)
        written = (len(new) * BLOCK_TOKENS + turn.output_tokens) * KV_BYTES_PER_TOKEN_DS
        # The next turn waits for nothing but its own read; the write-back shares the decode node's storage NIC.
        self.fabric.add(now, (self.snic[de.node],), written, lambda t: None)
        self._next_turn(turn.session, now)


def simulate(records: list[dict], policy: str, prefill_nodes: int = 1, decode_nodes: int = 2) -> dict:
    return DualPathSim(records, policy, prefill_nodes, decode_nodes).run()
