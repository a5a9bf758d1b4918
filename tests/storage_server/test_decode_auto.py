"""decode="auto" through a real node: it picks where compressed chunks are decoded per kv-get, and its pacer
charges the bytes the link carries.

One ``objectcache serve`` with a slow bandwidth pool (``capacity_gbps = 0.08``): a layerwise kv-get of chunks
stored compressed is granted that rate, so the node sends them as stored (the client decodes; over http as
ENCODED frames, over rdma packed into each layer's place); a chunkwise one
bypasses the pool and is decided by the link rate the client declares (unknown: the node decodes).
"""

from __future__ import annotations

import numpy as np
import pytest
from compressionsupport import kv_chunks, kv_layout
from kvsupport import TRANSPORTS, client, keys_for, reference, run
from support import ServerProcess, boto_client, make_tenants, write_config

from scheduler.codec_choice import CodecProfile
from storage_server.decode_choice import node_decode_figures


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("auto")
    people = make_tenants("alice")
    config = write_config(root / "c.toml", root / "data", people,
                          extra='\n[bandwidth]\ncapacity_gbps = 0.08\npolicy = "equal"\nburst_layers = 0\n'
                                '[compression]\ndecode_on_put = false\n')  # the first kv-get measures the node's decoders
    proc = ServerProcess(config).start()
    try:
        boto_client(proc.endpoint, people[0]).create_bucket(Bucket="kvz")
        yield proc, people[0]
    finally:
        proc.stop()


def _fetches(proc, alice, name: str, fetches: list[dict], link_gbps: float = 0.0, transport: str = "http"):
    """Put 8 zstd chunks, fetch them once decoded by the node (its decoders measured), then per ``fetches``."""
    layout = kv_layout(64)
    chunks = kv_chunks(layout, 8, seed=len(name))
    keys = keys_for(layout, 8, name)

    async def go():
        async with client(proc, alice, "kvz") as c:
            await c.put_chunks(keys, chunks, layout, codec="zstd")
            await c.fetch(keys, layout, transport, decode="node", verify=True)
            c.link_gbps = link_gbps
            return [await c.fetch(keys, layout, transport, verify=True, **kw) for kw in fetches]
    expected = reference(layout, chunks)
    out = run(go())
    for payload, _ in out:
        assert np.array_equal(payload, expected)  # byte-exact whichever side decoded
    return layout, [stats for _, stats in out]


@pytest.mark.parametrize("transport", ["http", TRANSPORTS[2]])
def test_a_slow_paced_link_sends_the_stored_bytes_and_charges_them(node, transport):
    proc, alice = node
    layout, [stats] = _fetches(proc, alice, f"paced-{transport}", [{"mode": "layerwise"}], transport=transport)
    site, alloc = stats.server.decode_site, stats.server.allocation
    assert site["site"] == "client", stats.server
    assert 0 < site["wire_bytes"] < layout.payload_bytes(8)  # compressed bytes on the link
    assert alloc["bytes_sent"] == site["wire_bytes"], alloc  # the pacer charged what the link carried, not the raw layers


def test_an_unpaced_kv_get_follows_the_declared_link_rate(node):
    proc, alice = node
    _, [unknown] = _fetches(proc, alice, "unpaced-unknown", [{"mode": "chunkwise"}])
    assert unknown.server.decode_site["site"] == "node", unknown.server.decode_site  # no rate: the node decodes
    assert "unknown" in unknown.server.decode_site["reason"]
    _, [slow] = _fetches(proc, alice, "unpaced-slow", [{"mode": "chunkwise"}], link_gbps=0.01)
    assert slow.server.decode_site["site"] == "client", slow.server.decode_site
    _, [forced] = _fetches(proc, alice, "forced-node", [{"mode": "chunkwise", "decode": "node"}], link_gbps=0.01)
    assert forced.server.decode_site["site"] == "node" and "decode='node'" in forced.server.decode_site["reason"]  # no choice asked for


def test_the_node_reads_its_decode_figures_from_the_pipelines_meters():
    assert node_decode_figures({}) == (0.0, 0.0)
    status = {"decompress": {"workers": 2, "bytes": 4e9, "busy_s": 2.0}, "dequantise": {"workers": 1, "bytes": 4e9, "busy_s": 2.0}}
    per_core, pipeline = node_decode_figures(status)
    assert per_core == pytest.approx(1e9)  # both stages on one core in turn: 4 GB in 4 thread-seconds
    assert pipeline == pytest.approx(2e9)  # the dequantise stage, on its one worker, bounds the pipeline
    assert CodecProfile("stored", 1.5, per_core).usable
