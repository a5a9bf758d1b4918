"""``bench ttft``'s deadline column: the same serving loop against a slow node, under a load budget.

A second node paces every layerwise kv-get to a quarter of the case's zero-stall rate
(``SLOWDOWN``: loading the whole prefix would take four times its compute), and the request carries
a load budget of twice the case's compute (``BUDGET_X``, at least ``MIN_BUDGET_S``; e.g. from its SLO). The loop asks the node
in its kv-lookup how much of the prefix lands within the budget (:class:`protocol.kv_http.LoadBudget`),
loads that prefix layer by layer and computes the rest of the context (the modelled compute of the
missing tokens; a load that falls behind anyway is cut by the node at a layer boundary and the whole
context is computed, as vLLM would). The column shows its TTFT, the share of the hit it loaded, and whether it stayed
within budget + full recompute — the bound a slow node may cost (``no-cache`` beside it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from client_sdk import KVLayout, ObjectCacheClient
from protocol.errors import ErrorCode, S3Error
from protocol.kv_http import LoadBudget

from .compute_model import NUM_LAYERS, ModelledGPU, per_layer_seconds
from .harness import BenchServer, print_table, start_server

SLOWDOWN = 4.0   # the slow node delivers the case's payload at 1/SLOWDOWN of its zero-stall rate
BUDGET_X = 2.0   # the request's load budget: this many times the case's own compute (L·c)
MIN_BUDGET_S = 0.05  # no SLO is tighter (--quick's ÷64 compute would otherwise give budgets of a few ms)
BUCKET = "bench-ttft-deadline"


@dataclass
class DeadlineCase:
    """One (G, context, hit) on the slow node."""

    layout: KVLayout
    keys: list[str]
    context: int
    scale: int

    @property
    def window_s(self) -> float:
        return per_layer_seconds(self.context, len(self.keys) * self.layout.chunk_tokens) / self.scale

    @property
    def budget_s(self) -> float:
        return max(MIN_BUDGET_S, BUDGET_X * NUM_LAYERS * self.window_s)

    def slow_gbps(self) -> float:
        """1/SLOWDOWN of the zero-stall rate: a layer of the whole hit per SLOWDOWN compute windows."""
        layer_bytes = len(self.keys) * self.layout.per_layer_chunk_bytes
        return layer_bytes / (SLOWDOWN * self.window_s) * 8 / 1e9


def slow_node(case: DeadlineCase) -> BenchServer:
    """A node that sends every layerwise kv-get (theta 0) at the slow rate, no burst credit."""
    return start_server(f'\n[storage_server]\ntheta_bytes = 0\n\n[bandwidth]\ncapacity_gbps = {case.slow_gbps()!r}\n'
                        'policy = "equal"\nburst_layers = 0\n')


async def measure_deadline(case: DeadlineCase, chunks: list, gpu: ModelledGPU) -> dict:
    """TTFT of the loop under the budget on a fresh slow node (the chunks stored there first)."""
    srv = slow_node(case)
    try:
        async with ObjectCacheClient(srv.endpoint, srv.access_key, srv.secret_key, bucket=BUCKET) as c:
            await c.ensure_bucket()
            await c.put_chunks(case.keys, chunks, case.layout)
            lay = case.layout
            t = time.perf_counter()
            reply = await c.lookup_within(case.keys, LoadBudget(case.budget_s, lay.num_layers, lay.per_layer_chunk_bytes))
            n, cut = reply.deliverable or 0, False
            if n:
                compute = per_layer_seconds(case.context, n * lay.chunk_tokens) / case.scale  # the missing tokens
                left = max(1e-3, case.budget_s - (time.perf_counter() - t))  # the lookup spent some of it
                try:
                    async with c.fetch_layers(case.keys[:n], lay, "shm", mode="layerwise", load_budget_s=left) as layers:
                        async for _index, _view in layers:
                            await gpu.compute(compute)
                except S3Error as e:  # fell behind anyway: cut at a layer boundary, and everything is recomputed
                    if e.code != ErrorCode.KVLoadBudgetExceeded:
                        raise
                    n, cut = 0, True
            fell_back = time.perf_counter() - t
            if not n:  # a recompute is one prefill of the whole context: one call (a per-layer thread hop each cost a loaded host ~2 ms)
                await gpu.compute(per_layer_seconds(case.context, 0) / case.scale * lay.num_layers)
            ttft = time.perf_counter() - t
            recomputed = ttft - fell_back if not n else None
    finally:
        srv.stop()
    recompute = per_layer_seconds(case.context, 0) / case.scale * NUM_LAYERS
    # The bound: the budget plus the recompute as this host ran it (the modelled GPU's sleep on a thread overshoots on a
    # busy host; the nominal compute where the load was kept).
    bound = case.budget_s + (recompute if recomputed is None else max(recompute, recomputed))
    return {"ttft_s": ttft, "recompute_started_s": None if recomputed is None else fell_back, "recompute_s": recomputed,
            "budget_s": case.budget_s, "loaded_chunks": n, "hit_chunks": len(case.keys), "cut": cut, "slow_gbps": case.slow_gbps(),
            "no_cache_s": recompute, "bound_s": bound, "within_budget_plus_recompute": ttft <= bound}


def cell(d: dict) -> str:
    """The table cell: TTFT, the share of the hit loaded, and the bound."""
    loaded = "cut, recomputed" if d["cut"] else f"{d['loaded_chunks'] / max(d['hit_chunks'], 1):.0%} loaded"
    return f"{d['ttft_s']:.3f} ({loaded}, ≤ {d.get('bound_s', d['budget_s'] + d['no_cache_s']):.3f})"


def report(rows: list[dict]) -> dict[str, bool]:
    """Print the deadline table (rows that have a ``deadline``) and return its target."""
    rows = [r for r in rows if r.get("deadline")]
    if not rows:
        return {}
    print(f"\nUnder a load budget on a slow node (paced to 1/{SLOWDOWN:g} of the zero-stall rate; budget {BUDGET_X:g}× the "
          "case's compute): the node answers how much of the prefix lands in time, the loop loads that and computes the rest.\n")
    print_table(["G", "context", "hit", "budget s", "slow node Gbps", "deadline s (loaded, bound)", "no-cache s", "ObjectCache-LW s"],
                [[r["chunk_tokens"], r["context"], r["hit"], f"{r['deadline']['budget_s']:.3f}", f"{r['deadline']['slow_gbps']:.2f}",
                  cell(r["deadline"]), f"{r['deadline']['no_cache_s']:.3f}", f"{r['paths']['ObjectCache-LW']['ttft_s']:.3f}"] for r in rows])
    return {"deadline: TTFT ≤ budget + recompute on a slow node": all(r["deadline"]["within_budget_plus_recompute"] for r in rows)}
