"""``kv-estimate`` on real nodes (issue 26): the delivery-time oracle asked through the SDK and through a
botocore-signed request, its answers limited to the asking tenant's own chunks, bad input refused naming
the field, and every kv-get's prediction set against the measured time in the metrics.

Two nodes over one moto upstream, one rack apart: ``a`` (host ``host-a``, rack r1) and ``b``
(host ``host-b``, rack r2, zone z1 for both).
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from clustersupport import cluster_key, node_config, status, wait_for, wait_live
from kvsupport import client, keys_for, make_chunks, reference, run, tiny_layout
from metricsupport import scrape, value
from rawhttp import signed
from support import ServerProcess, boto_client, free_port, make_tenants, start_together
from upstream import MotoServer

from protocol.errors import ErrorCode, S3Error
from protocol.estimate import MAX_ESTIMATE_CANDIDATES, MAX_ESTIMATE_KEYS, EstimateReply

LAYOUT = tiny_layout(16, num_layers=8)  # a chunk is 256 bytes
CHUNK = LAYOUT.chunk_bytes


def _node(root, name, moto, people, key, rack, metrics_port=0) -> ServerProcess:
    """A node's process, configured (not started: the module's nodes start side by side)."""
    port = free_port()
    path = node_config(root, name, moto, people, key, port, host=f"host-{name}", rack=rack, zone="z1", estimate_refresh_s=0.2)
    if metrics_port:
        path.write_text(path.read_text() + f"[metrics]\nstorage_server_port = {metrics_port}\n")
    node = ServerProcess(path)
    node.rpc_socket = str(root / f"{name}.sock")
    return node


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("estimate")
    moto = MotoServer(root / "moto.log").start()
    people = make_tenants("alice", "bob")
    key = cluster_key()
    metrics = free_port()
    nodes = {"a": _node(root, "a", moto, people, key, "r1", metrics), "b": _node(root, "b", moto, people, key, "r2")}
    start_together(list(nodes.values()))
    for name, n in nodes.items():
        wait_live(n, set(nodes) - {name})
    yield nodes, {t.name: t for t in people}, metrics
    for n in nodes.values():
        n.stop()
    moto.stop()


async def _put(node, tenant, bucket, keys, chunks) -> None:
    async with client(node, tenant, bucket) as c:
        assert await c.put_chunks(keys, chunks, LAYOUT) == len(keys)


async def _estimate(node, tenant, bucket, keys, candidates) -> EstimateReply:
    async with client(node, tenant, bucket) as c:
        return await c.estimate(keys, candidates, LAYOUT)


def _warm_on_b(cluster, bucket: str, n: int, seed: int) -> list[str]:
    nodes, people, _ = cluster
    boto_client(nodes["a"].endpoint, people["alice"]).create_bucket(Bucket=bucket)
    keys = keys_for(LAYOUT, n, bucket)
    run(_put(nodes["b"], people["alice"], bucket, keys, make_chunks(LAYOUT, n, seed)))  # written through B's cache only
    return keys


def test_a_prefix_warm_only_on_a_peer_is_reported_warm_there_with_a_peer_path(cluster):
    nodes, people, _ = cluster
    keys = _warm_on_b(cluster, "est-peer", 24, seed=1)
    reply = run(_estimate(nodes["a"], people["alice"], "est-peer", keys, ["host-a", "host-b"]))
    assert (reply.keys, reply.chunk_bytes, reply.num_layers) == (24, CHUNK, 8)
    on_a, on_b = reply.candidates
    assert on_a.host == "host-a" and [(w.where, w.chunks) for w in on_a.warm] == [("b", 24)]
    assert [(p.source, p.first_chunk, p.end_chunk) for p in on_a.path] == [("peer:b", 0, 24)]
    peer = next(link for link in on_a.links if link.name == "b->a")
    assert peer.tier == "same-zone" and peer.bandwidth_bytes_per_s > 0  # one rack apart, one zone
    assert 0 < on_a.first_layer_s <= on_a.total_s
    # For the engine beside B the prefix is in its own node's cache: the local path, same host.
    assert [(p.source, p.first_chunk, p.end_chunk) for p in on_b.path] == [("local", 0, 24)]
    assert [link.tier for link in on_b.links] == ["same-host"]
    assert on_b.total_s < on_a.total_s
    # Nothing warm anywhere for a cold prefix: the upstream through the candidate's node.
    cold = keys_for(LAYOUT, 5, "est-peer-cold")
    reply = run(_estimate(nodes["a"], people["alice"], "est-peer", cold, ["host-a"]))
    assert reply.candidates[0].warm == [] and [p.source for p in reply.candidates[0].path] == ["upstream@a"]


def test_kv_estimate_through_a_botocore_signed_request(cluster):
    nodes, people, _ = cluster
    keys = _warm_on_b(cluster, "est-signed", 6, seed=2)
    body = json.dumps({"keys": keys, "candidates": ["b", "host-a"], "chunk_bytes": CHUNK, "num_layers": 8}).encode()
    r = signed(nodes["a"].endpoint, people["alice"], "POST", "/est-signed?kv-estimate", {"Content-Type": "application/json"}, body)
    assert r.status == 200, r.body
    reply = EstimateReply.from_json(json.loads(r.body))
    assert [c.host for c in reply.candidates] == ["b", "host-a"]  # a node id names its host too
    assert reply.candidates[0].path[0].source == "local" and reply.candidates[1].path[0].source == "peer:b"


def test_another_tenants_bucket_is_refused_and_identical_keys_report_only_the_askers_chunks(cluster):
    nodes, people, _ = cluster
    keys = _warm_on_b(cluster, "est-alice", 10, seed=3)
    with pytest.raises(S3Error) as e:
        run(_estimate(nodes["a"], people["bob"], "est-alice", keys, ["host-a"]))
    assert e.value.code is ErrorCode.AccessDenied and e.value.extra.get("ArgumentName") == "bucket"
    # Bob's own bucket, the very same key names, three of them warm on A: he learns of his three, nothing of Alice's ten on B.
    boto_client(nodes["a"].endpoint, people["bob"]).create_bucket(Bucket="est-bob")
    run(_put(nodes["a"], people["bob"], "est-bob", keys[:3], make_chunks(LAYOUT, 3, seed=4)))
    reply = run(_estimate(nodes["a"], people["bob"], "est-bob", keys, ["host-a", "host-b"]))
    for cand in reply.candidates:
        assert [(w.where, w.chunks) for w in cand.warm] == [("a", 3)]
        assert all(not p.source.startswith("peer:b") for p in cand.path)
    # Asked at B (where Alice's chunks are): the same.
    reply = run(_estimate(nodes["b"], people["bob"], "est-bob", keys, ["host-b"]))
    assert [(w.where, w.chunks) for w in reply.candidates[0].warm] == [("a", 3)]


def _raw(cluster, body: object, bucket: str = "est-bad"):
    nodes, people, _ = cluster
    r = signed(nodes["a"].endpoint, people["alice"], "POST", f"/{bucket}?kv-estimate", {}, json.dumps(body).encode())
    return r.status, r.body.decode()


def test_bad_input_is_refused_naming_the_field(cluster):
    nodes, people, _ = cluster
    boto_client(nodes["a"].endpoint, people["alice"]).create_bucket(Bucket="est-bad")
    good = {"keys": ["k0", "k1"], "candidates": ["host-a"], "chunk_bytes": CHUNK, "num_layers": 8}
    cases = {
        "candidates": [{**good, "candidates": ["gpu-unknown"]}, {**good, "candidates": [f"h{i}" for i in range(MAX_ESTIMATE_CANDIDATES + 1)]},
                       {**good, "candidates": []}, {**good, "candidates": ["host-a", "host-a"]}],
        "keys": [{**good, "keys": [f"k{i}" for i in range(MAX_ESTIMATE_KEYS + 1)]}, {**good, "keys": []}],
        "key": [{**good, "keys": [".objectcache/cluster/nodes/a.json"]}],
        "num_layers": [{k: v for k, v in good.items() if k != "num_layers"}, {**good, "num_layers": 7}],
        "chunk_bytes": [{**good, "chunk_bytes": 0}, {**good, "chunk_bytes": "big"}],
    }
    for field, bodies in cases.items():
        for body in bodies:
            code, text = _raw(cluster, body)
            assert code == 400 and "<Code>InvalidArgument</Code>" in text, (field, text)
            assert f"<ArgumentName>{field}</ArgumentName>" in text, (field, text)
    code, text = _raw(cluster, ["not", "an", "object"])
    assert code == 400 and "<Code>InvalidRequest</Code>" in text
    code, text = _raw(cluster, good, bucket="est-nobody")
    assert code == 404 and "<Code>NoSuchBucket</Code>" in text
    # The SDK refuses what the server would, before sending.
    with pytest.raises(S3Error) as e:
        run(_estimate(nodes["a"], people["alice"], "est-bad", [], ["host-a"]))
    assert e.value.extra.get("ArgumentName") == "keys"


def test_every_kv_get_puts_its_predicted_and_measured_times_in_the_metrics(cluster):
    nodes, people, metrics = cluster
    keys = _warm_on_b(cluster, "est-metrics", 16, seed=5)
    before = scrape(metrics)
    took = []  # each kv-get's bytes per path: the first from B's cache or A's upstream (the path scheduler's choice), then A's own
    for _ in range(2):
        async def fetch():
            async with client(nodes["a"], people["alice"], "est-metrics") as c:
                return await c.fetch(keys, LAYOUT, "http", mode="layerwise")
        payload, stats = run(fetch())
        assert np.array_equal(payload, reference(LAYOUT, make_chunks(LAYOUT, 16, seed=5)))
        took.append(stats.server.paths)
    counted = [(name, phase) for phase in ("first_layer", "total")
               for name in ("objectcache_oracle_measured_over_predicted_count", "objectcache_oracle_error_seconds_count")]

    after = scrape(metrics)  # the node records a kv-get before its end frame: the engine holding its bytes sees it
    for name, phase in counted:
        assert value(after, name, phase=phase) - value(before, name, phase=phase) == 2, (name, phase)
    for phase in ("first_layer", "total"):
        assert value(after, "objectcache_oracle_measured_over_predicted_sum", phase=phase) > 0
    # The engine link's measured rate reaches the oracle (EWMA at the next refresh).
    def settled():  # every kv-get folded in: two reads a few refreshes apart agree
        first = status(nodes["a"])["oracle"]["measured_bytes_per_s"]
        time.sleep(0.6)
        return first if first and first == status(nodes["a"])["oracle"]["measured_bytes_per_s"] else None

    rates = wait_for(settled, what="the measured rates")
    assert rates.get("a->host-a", 0) > 0, (rates, took)
    if took[0].get("peer:b", 0) > 0:  # B's link carried the first: its achieved rate is measured too
        assert rates.get("b->a", 0) > 0, (rates, took)
    # Each kv-get taught its fixed costs: the fetched share that landed last (its source and any fetch's), the pin with
    # nothing to fetch, every delivery.
    oracle = status(nodes["a"])["oracle"]
    learnt = oracle["startup_s"]
    assert {"fetch", "pin", "deliver"} <= set(learnt) and {"peer:b", "upstream@a"} & set(learnt), learnt
    # Every request read the bucket's record from the upstream (bucket_record_ttl_s = 0): its measured time is what a
    # pin of cached chunks costs before it has been learnt.
    assert oracle["record_s"] is not None and oracle["record_s"] > 0, oracle
    # ... and replaces the configured bandwidth (200 Gbit/s same host) in kv-estimate's inputs while fresh.
    reply = run(_estimate(nodes["a"], people["alice"], "est-metrics", keys, ["host-a"]))
    engine = next(link for link in reply.candidates[0].links if link.name == "a->host-a")
    assert engine.bandwidth_bytes_per_s == pytest.approx(rates["a->host-a"], rel=0.01) and engine.bandwidth_bytes_per_s < 200e9 / 8
