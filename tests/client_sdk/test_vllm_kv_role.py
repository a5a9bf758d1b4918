"""vLLM's ``kv_role``: a ``kv_consumer`` engine loads but never saves, a ``kv_producer`` saves but never loads
(``kv_both``: both). Pure: the connector's scheduler half with a lookup that counts and a step that completes blocks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from client_sdk.vllm_connector.scheduler import SchedulerSide

BLOCK = 16
PROMPT = list(range(BLOCK * 4 + 1))  # 4 loadable chunks, 4 full blocks to save


def _step(req_id: str, tokens: int):
    new = SimpleNamespace(req_id=req_id, num_computed_tokens=0)
    return SimpleNamespace(scheduled_new_reqs=[new], scheduled_cached_reqs=SimpleNamespace(req_ids=[], num_computed_tokens=[]),
                           num_scheduled_tokens={req_id: tokens}, scheduled_spec_decode_tokens={})


@pytest.mark.parametrize(("loads", "saves"), [(True, True), (True, False), (False, True)], ids=["kv_both", "kv_consumer", "kv_producer"])
def test_each_role_loads_and_saves_only_what_it_is_for(loads: bool, saves: bool):
    asked: list[int] = []

    def lookup(keys):
        asked.append(len(keys))
        return 2  # two chunks stored

    side = SchedulerSide("ns", BLOCK, lookup, lambda req_id: list(range(10)), loads=loads, saves=saves)
    request = SimpleNamespace(request_id="r", prompt_token_ids=PROMPT, all_token_ids=PROMPT, kv_transfer_params=None)
    matched, _ = side.get_num_new_matched_tokens(request, 0)
    assert (matched, asked) == ((2 * BLOCK, [4]) if loads else (0, []))
    _, planned = side.build(_step("r", len(PROMPT)))
    saved = [k for t in planned for k in t.keys]
    # kv_both saves the blocks it computed (those after the two stored); a producer that loaded nothing saves all four.
    assert len(saved) == (0 if not saves else 2 if loads else 4)
