"""Inputs of the cluster simulator: compute models, workloads from Mooncake-format traces, metrics.

Compute is piecewise-linear in tokens, as both papers fit it from published
profiles: prefill latency of Llama-3-70B at TP=4 on H100-class GPUs (NetKV's
setting, interpolated between the points below) and the decode iteration time
as a function of batch size; DeepSeek-V3.2-class prefill per GPU for DualPath.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Llama-3-70B, TP=4, H100-class: prompt tokens -> prefill seconds (≈11K tokens/s plus attention growing with length).
PREFILL_POINTS = ((0, 0.02), (1024, 0.11), (4096, 0.40), (8192, 0.85), (16384, 1.90), (32768, 4.40), (65536, 11.0))
# Decode iteration time (s) by batch size: weights read once per step, KV reads grow with the batch.
DECODE_POINTS = ((1, 0.0122), (16, 0.0126), (32, 0.0131), (64, 0.0142), (128, 0.0170))
KV_BYTES_PER_TOKEN_70B = 320 * 1024  # Llama-3-70B, FP16, all layers (NetKV §III-B)
BLOCK_TOKENS = 512  # Mooncake traces' hash_ids blocks
SAMPLE_TRACE = Path(__file__).parent / "data" / "mooncake_synthetic_trace_sample.jsonl"


def prefill_s(tokens: float) -> float:
    xs, ys = zip(*PREFILL_POINTS)
    return float(np.interp(tokens, xs, ys))


def decode_step_s(batch: int) -> float:
    xs, ys = zip(*DECODE_POINTS)
    return float(np.interp(max(batch, 1), xs, ys))


# DualPath (DeepSeek-V3.2-class MLA, FP8 KV, one GPU of an EP/DP engine): per-token KV bytes and prefill time.
KV_BYTES_PER_TOKEN_DS = 656 * 61  # 512 latent + 64 rope dims in FP8 plus scales, 61 layers


def ds_prefill_s(append: int, context: int) -> float:
    """Prefill of ``append`` new tokens over ``context`` cached ones on one GPU: fixed + per token + attention."""
    return 0.02 + append / 8000 + append * context * 2e-9


@dataclass(frozen=True)
class Request:
    arrival: float
    input_tokens: int
    output_tokens: int
    blocks: tuple[int, ...]  # prefix block ids (equal ids: shared prefix)


def load_records(path: Path) -> list[dict]:
    records = []
    with open(path) as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            r = json.loads(line)
            for key in ("timestamp", "input_length", "hash_ids"):
                if key not in r:
                    raise ValueError(f"{path}:{i + 1}: missing {key!r}")
            records.append(r)
    return records


@dataclass(frozen=True)
class Profile:
    """A NetKV workload: prompt lengths kept from the trace, prefix sharing, TTFT SLO."""

    name: str
    min_tokens: int
    max_tokens: int
    share: float  # probability that a replayed request keeps its prefix (else it gets fresh blocks)
    slo_s: float


PROFILES = {
    "chatbot": Profile("chatbot", 1, 8192, 0.6, 2.0),
    "rag": Profile("rag", 8193, 16384, 0.4, 5.0),
    "long-context": Profile("long-context", 16385, 1 << 30, 0.2, 10.0),
}


def workload(records: list[dict], profile: Profile, rate_rps: float, duration_s: float, seed: int) -> list[Request]:
    """The profile's requests of the trace, replayed in cycles until ``duration_s``, timestamps scaled to ``rate_rps``.

    Scaling keeps the trace's burstiness. Each cycle after the first keeps a request's
    prefix blocks with probability ``share`` (a prompt seen again) and otherwise renames them.
    """
    rows = [r for r in records if profile.min_tokens <= r["input_length"] <= profile.max_tokens]
    if not rows:
        raise ValueError(f"the trace has no requests for the {profile.name} profile ({profile.min_tokens}..{profile.max_tokens} tokens)")
    t0 = min(r["timestamp"] for r in rows)
    span = max(r["timestamp"] for r in rows) - t0
    gap = span / max(len(rows) - 1, 1) if span > 0 else 1000.0
    period = span + gap  # one cycle of the filtered trace, in trace milliseconds
    scale = rate_rps / (len(rows) / (period / 1000))  # trace seconds per simulated second
    rng = np.random.default_rng(seed)
    out: list[Request] = []
    for cycle in range(10_000):
        for r in rows:
            t = ((r["timestamp"] - t0) + cycle * period) / 1000 / scale
            if t >= duration_s:
                return out
            keep = cycle == 0 or rng.random() < profile.share
            blocks = tuple(r["hash_ids"]) if keep else tuple(h + (cycle << 32) for h in r["hash_ids"])
            out.append(Request(t, int(r["input_length"]), max(int(r.get("output_length", 1)), 1), blocks))
    return out


def agentic_records(agents: int, start_context: tuple[int, int], max_context: int, seed: int) -> list[dict]:
    """Mooncake-format records of agent trajectories (DualPath's agentic shape: long, growing contexts, short appends).

    Each agent starts with a context drawn from ``start_context``; every turn appends ~429 tokens
    (exponential, DualPath's mean) and generates ~100 until the context passes ``max_context``.
    A turn's ``hash_ids`` extend the previous turn's, so everything but the newest tokens is a
    cache hit. ``timestamp`` 0: all agents start at once (an offline batch).
    """
    rng = np.random.default_rng(seed)
    records, next_block = [], 0
    for agent in range(agents):
        context = int(rng.integers(*start_context))
        blocks: list[int] = []
        while True:
            while len(blocks) < math.ceil(context / BLOCK_TOKENS):
                blocks.append(next_block)
                next_block += 1
            append = max(1, int(rng.exponential(429)))
            gen = max(1, int(rng.exponential(100)))
            records.append({"timestamp": 0, "input_length": context + append, "output_length": gen,
                            "hash_ids": list(blocks), "session": agent})
            context += append + gen
            if context > max_context:
                break
    return records


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan
