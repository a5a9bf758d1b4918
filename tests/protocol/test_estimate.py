"""The kv-estimate records: the documented JSON round-trips, bad questions name their field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from protocol.errors import S3Error
from protocol.estimate import MAX_ESTIMATE_CANDIDATES, MAX_ESTIMATE_KEYS, CandidateEstimate, EstimateReply, EstimateRequest, LinkInputs, PathSegment, WarmRun
from scheduler import LinkView, OracleView, PathRequest, Source, SourceKind, Tier, choose_path
from scheduler.estimate import candidate_estimate


def documented_example() -> dict:
    doc = EstimateReply.__module__
    text = __import__(doc, fromlist=["x"]).__doc__
    return json.loads(text.split("Example answer::", 1)[1].split("\n\n", 2)[1])


def test_the_documented_answer_decodes_and_round_trips():
    reply = EstimateReply.from_json(documented_example())
    assert reply.candidates[0].path[0] == PathSegment("peer:node-b", 0, 200)
    assert reply.candidates[0].links[0].tier == "same-rack"
    assert EstimateReply.from_json(json.loads(json.dumps(reply.to_json()))) == reply


def test_a_missing_or_mistyped_field_is_named():
    obj = documented_example()
    del obj["candidates"][0]["total_s"]
    with pytest.raises(S3Error, match="total_s"):
        EstimateReply.from_json(obj)
    obj = documented_example()
    obj["candidates"][0]["warm"][0]["chunks"] = "many"
    with pytest.raises(S3Error, match="chunks"):
        EstimateReply.from_json(obj)


GOOD = {"chunk_bytes": 256, "num_layers": 8}


@pytest.mark.parametrize("body,field", [
    ({"keys": [], "candidates": ["h"], **GOOD}, "keys"),
    ({"keys": ["k"] * (MAX_ESTIMATE_KEYS + 1), "candidates": ["h"], **GOOD}, "keys"),
    ({"keys": [""], "candidates": ["h"], **GOOD}, "keys"),
    ({"keys": ["k"], "candidates": [], **GOOD}, "candidates"),
    ({"keys": ["k"], "candidates": [f"h{i}" for i in range(MAX_ESTIMATE_CANDIDATES + 1)], **GOOD}, "candidates"),
    ({"keys": ["k"], "candidates": ["h", "h"], **GOOD}, "candidates"),
    ({"keys": ["k"], "candidates": ["h"], "chunk_bytes": 0, "num_layers": 8}, "chunk_bytes"),
    ({"keys": ["k"], "candidates": ["h"], "chunk_bytes": 256, "num_layers": 3}, "num_layers"),
    ({"keys": ["k"], "candidates": ["h"], "chunk_bytes": 256}, "num_layers"),
])
def test_bad_questions_are_refused_naming_the_field(body, field):
    with pytest.raises(S3Error) as e:
        EstimateRequest.from_json(body).check()
    assert e.value.extra["ArgumentName"] == field


def test_the_documented_question_decodes():
    text = __import__(EstimateRequest.__module__, fromlist=["x"]).__doc__
    example = text.split("engine)::", 1)[1].split("\n\n", 2)[1].replace('"<chunk key 0>", "<chunk key 1>", ...', '"k0", "k1"')
    req = EstimateRequest.from_json(json.loads(example)).check()
    assert (req.chunk_bytes, req.num_layers, req.candidates) == (8388608, 32, ["gpu-7", "gpu-9"])


def test_the_readme_json_examples_decode():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### Asking a node: `kv-estimate`", 1)[1].split("\n## ", 1)[0]
    question, answer = re.findall(r"```json\n(.*?)```", section, re.S)
    req = EstimateRequest.from_json(json.loads(question)).check()
    assert req.candidates == ["gpu-7", "gpu-9"] and req.chunk_bytes % req.num_layers == 0
    reply = EstimateReply.from_json(json.loads(answer))
    assert [link.name for link in reply.candidates[0].links] == ["node-b->node-a", "node-a->gpu-7"]


def test_a_path_choice_becomes_a_candidate_estimate_with_its_inputs():
    links = {"peer": LinkView("peer", 1e9, tier=Tier.SAME_RACK, background=0.25, age_s=1.0),
             "up": LinkView("up", 5e8, tier=Tier.CROSS_ZONE, measured_bytes_per_s=4e8).with_flow(1e6)}
    view = OracleView((Source("peer:b", SourceKind.PEER, 4, ("peer",)), Source("upstream@a", SourceKind.UPSTREAM, 99, ("up",))), links, 10.0)
    choice = choose_path(PathRequest(8, 1e7, 32), view)
    est = candidate_estimate("gpu-1", {"b": 4, "c": 0}, choice, view)
    assert est.warm == [WarmRun("b", 4)]
    assert [p.source for p in est.path] == ["peer:b", "upstream@a"]
    assert est.links == [LinkInputs("peer", "same-rack", 1e9, 0.25, 0.0), LinkInputs("up", "cross-zone", 4e8, 0.0, 1e6)]
    assert est.total_s == choice.total_s and isinstance(CandidateEstimate.from_json(est.to_json()), CandidateEstimate)
