"""Prefill compute model: Llama 3.1 8B on one A100 (DESIGN §7), for machines without a GPU.

The table gives total prefill time for (context, cached tokens). Prefill of
``m`` miss tokens after ``h`` cached ones costs linear work per token plus
attention over the whole context: ``T(m, n) = a·m + b·m·n`` with ``n = h + m``.
``a`` and ``b`` are fitted to the table by least squares; per-layer compute is
``T / 32``.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

NUM_LAYERS = 32
# (context tokens, cached tokens) -> total prefill compute (ms)
A100_LLAMA_3_1_8B = {
    (4096, 2048): 185.31, (4096, 3584): 63.47,
    (16384, 8192): 955.89, (16384, 14336): 281.76,
    (32768, 16384): 2589.25, (32768, 28672): 763.19,
    (65536, 32768): 8672.79, (65536, 57344): 2423.90,
}


def _fit() -> tuple[float, float]:
    rows, y = [], []
    for (n, h), ms in A100_LLAMA_3_1_8B.items():
        m = n - h
        rows.append([m, m * n])
        y.append(ms / 1000)
    (a, b), *_ = np.linalg.lstsq(np.array(rows, float), np.array(y), rcond=None)
    return float(a), float(b)


A, B = _fit()


def prefill_seconds(context: int, cached: int) -> float:
    """Total prefill compute of the miss tokens (table value when it is a table point)."""
    exact = A100_LLAMA_3_1_8B.get((context, cached))
    if exact is not None:
        return exact / 1000
    m = max(context - cached, 0)
    return max(A * m + B * m * context, 0.0)


def per_layer_seconds(context: int, cached: int) -> float:
    return prefill_seconds(context, cached) / NUM_LAYERS


def modelled_ttft(arrivals: list[float], compute_per_layer: float) -> float:
    """TTFT with one-layer prefetch (DESIGN §5): X_0 + Σ max(X_{ℓ+1}, C_ℓ) + C_{L-1}.

    ``arrivals`` are the times (from the request start) at which each layer landed.
    Computing layer ℓ starts when it has landed and layer ℓ-1 is computed.
    """
    done = 0.0
    for t in arrivals:
        done = max(done, t) + compute_per_layer
    return done


class ModelledGPU:
    """Stands in for the GPU: "computing" a layer is a precise sleep on a thread of its own.

    The event loop's timers are millisecond-grained (uvloop rounds a 0.3 ms sleep
    to 0), while per-layer compute at short contexts is a fraction of a
    millisecond; ``time.sleep`` on a thread keeps ~0.1 ms precision, and the
    serving loop awaits it as it would a CUDA event, free to take other frames.
    """

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="modelled-gpu")

    async def compute(self, seconds: float) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, time.sleep, seconds)

    def close(self) -> None:
        self._thread.shutdown(wait=True)
