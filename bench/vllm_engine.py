"""One vLLM engine for ``bench vllm``, in a process of its own: ``python -m bench.vllm_engine SPEC.json``.

``SPEC``: ``model``, ``path`` (``recompute``: no cache at all; ``local``: vLLM's own prefix cache;
``connector``: ObjectCache's connector with ``extra_config``), ``max_model_len``, ``kv_bytes`` and
``steps``: each ``{"prompt": [...], "timed": bool}`` in order. Untimed steps warm the engine up
(and, for ``local``, put the prefix in engine memory). Each timed step is one greedy generate of
one token, timed around the call (the engine runs in this process, so that is its TTFT). Prints
``RESULT {"steps": [{"ttft_s", "token", "cached"}, ...]}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
       "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false"}
BLOCK = 32


def make_llm(spec: dict[str, Any]):
    for k, v in ENV.items():
        os.environ.setdefault(k, v)
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kv = None
    if spec["path"] == "connector":
        kv = KVTransferConfig(kv_connector="ObjectCacheConnector", kv_connector_module_path="client_sdk.vllm_connector", kv_role=spec.get("kv_role", "kv_both"),
                              kv_load_failure_policy="recompute", kv_connector_extra_config=spec["extra_config"])
    return LLM(model=spec["model"], dtype="float32", block_size=BLOCK, enforce_eager=True, enable_prefix_caching=spec["path"] == "local",
               max_model_len=spec["max_model_len"], kv_cache_memory_bytes=spec["kv_bytes"], seed=0, kv_transfer_config=kv)


def flush_saves() -> None:
    """Let the connector's background saves finish, so they do not run beside the next timed step."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if has_kv_transfer_group():
        get_kv_transfer_group().flush_saves()


def main(spec_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    llm = make_llm(spec)
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
    out = []
    for step in spec["steps"]:
        flush_saves()
        t0 = time.perf_counter()
        result = llm.generate([{"prompt_token_ids": step["prompt"]}], params, use_tqdm=False)[0]
        ttft = time.perf_counter() - t0
        if step["timed"]:
            out.append({"ttft_s": ttft, "token": result.outputs[0].token_ids[0], "cached": result.num_cached_tokens or 0})
    flush_saves()
    print("RESULT " + json.dumps({"steps": out}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
