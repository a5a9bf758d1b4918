"""Running the tiny model under vLLM with (or without) ObjectCache's connector, in a process of its own.

``python vllm_support.py SPEC.json`` starts one engine. ``SPEC`` has ``model`` and, for the
connector, ``extra_config``. With ``prompts`` and ``max_tokens`` it generates once and prints
``RESULT [{"tokens": [...], "cached": n}, ...]`` (one per prompt, in order); without them it
serves commands, one JSON line each on stdin, each answered by one ``RESULT`` line:
``{"op": "generate", "prompts": [...], "max_tokens": n}`` (optionally ``"salts"`` and ``"transfer_params"``: each prompt's ``cache_salt`` and ``kv_transfer_params``) and ``{"op": "stats"}`` (the
connector's counts in this process). Engines never run inside the test process: vLLM scans and
patches every loaded module at start-up, which the test process's many libraries break.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

# Offline, in this process (no engine-core subprocess), threads left where the OS puts them:
# pinning them would pin the whole test process.
ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
       "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false"}
BLOCK = 32
DTYPE = "float32"


def kv_transfer_config(extra_config: dict[str, Any], module: str = "client_sdk.vllm_connector") -> dict[str, Any]:
    """The configuration the README documents, as vLLM takes it."""
    return {"kv_connector": "ObjectCacheConnector", "kv_connector_module_path": module, "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute", "kv_connector_extra_config": extra_config}


def make_llm(model: str, extra_config: dict[str, Any] | None):
    for k, v in ENV.items():
        os.environ.setdefault(k, v)
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kv = KVTransferConfig(**kv_transfer_config(extra_config)) if extra_config is not None else None
    # No local prefix cache: every cached token a test sees came through the connector.
    return LLM(model=model, dtype=DTYPE, block_size=BLOCK, enforce_eager=True, enable_prefix_caching=False, max_model_len=1024,
               kv_cache_memory_bytes=32 << 20, seed=0, kv_transfer_config=kv)


def generate(llm, prompts: list[list[int]], max_tokens: int, salts: list[str | None] | None = None,
             transfer_params: list[dict | None] | None = None) -> list[dict[str, Any]]:
    """Greedy decoding, one prompt at a time (each its own engine steps).

    ``salts[i]`` is prompt i's ``cache_salt``, ``transfer_params[i]`` its ``kv_transfer_params``.
    """
    from vllm import SamplingParams

    results = []
    for i, p in enumerate(prompts):
        prompt: dict[str, Any] = {"prompt_token_ids": p}
        if salts and salts[i] is not None:
            prompt["cache_salt"] = salts[i]
        extra = {"kv_transfer_params": transfer_params[i]} if transfer_params and transfer_params[i] else None
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, extra_args=extra)
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        results.append({"tokens": list(out.outputs[0].token_ids), "cached": out.num_cached_tokens or 0})
    return results


def main(spec_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    llm = make_llm(spec["model"], spec.get("extra_config"))
    if "prompts" in spec:
        print("RESULT " + json.dumps(generate(llm, spec["prompts"], spec["max_tokens"])), flush=True)
        return
    print("READY", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "generate":
            out: Any = generate(llm, cmd["prompts"], cmd["max_tokens"], cmd.get("salts"), cmd.get("transfer_params"))
        elif cmd["op"] == "stats":
            from vllm.distributed.kv_transfer import get_kv_transfer_group

            out = get_kv_transfer_group().stats
        else:
            out = {"error": f"unknown op {cmd['op']!r}"}
        print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
