"""A vLLM engine (the tiny model) that answers generate commands with each step's logprobs, in a process of its own.

``python vllm_logprobs.py SPEC.json`` (``model``, optional ``extra_config`` for the connector) prints READY, then
answers each stdin line ``{"prompts": [...], "max_tokens": n}`` with one ``RESULT`` line: per prompt the greedy
tokens, the cached token count and, per step, the chosen token's logprob and the top-5 logprobs.
"""

from __future__ import annotations

import json
import sys

from vllm_support import make_llm


def generate(llm, prompts: list[list[int]], max_tokens: int) -> list[dict]:
    from vllm import SamplingParams

    results = []
    for p in prompts:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=5)
        request = llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0]
        out = request.outputs[0]
        steps = [{str(t): lp.logprob for t, lp in step.items()} for step in out.logprobs]
        results.append({"tokens": list(out.token_ids), "cached": request.num_cached_tokens or 0, "logprobs": steps})
    return results


def main(spec_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    llm = make_llm(spec["model"], spec.get("extra_config"))
    print("READY", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        print("RESULT " + json.dumps(generate(llm, cmd["prompts"], cmd["max_tokens"])), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
