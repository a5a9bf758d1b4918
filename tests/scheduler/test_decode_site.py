"""Where compressed chunks are decoded: the client on slow links (fewer bytes cross it), the node on fast ones or
when in doubt (the engine's host keeps its CPU), and the tandem pipeline the choice rests on."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.codec_choice import RAW, CodecProfile, pipeline_stall
from scheduler.decode_site import DecodeSiteRequest, choose_decode_site

GBPS = 1e9 / 8
ZSTD = CodecProfile("zstd", 1.5, 1.5e9)
PAYLOAD = 32 * 16 * 1024 * 1024


def req(gbps: float | None, stored: CodecProfile = ZSTD, node: int = 4, client: int = 2, compute: float = 0.0):
    return DecodeSiteRequest(None if gbps is None else gbps * GBPS, PAYLOAD, 32, stored, node, client, compute)


def test_slow_link_decodes_in_the_client():
    site = choose_decode_site(req(1))
    assert site.site == "client" and site.client_stall_s < site.node_stall_s
    assert site.node_stall_s / site.client_stall_s == pytest.approx(ZSTD.ratio, rel=0.05)  # link-bound: the ratio


def test_fast_link_decodes_in_the_node():
    # At 100 Gbps the link is not the bottleneck; the node's 4 workers decode faster than the client's 2.
    site = choose_decode_site(req(100))
    assert site.site == "node" and site.node_stall_s < site.client_stall_s


def test_ties_unknown_rates_raw_chunks_and_no_client_workers_stay_in_the_node():
    tie = choose_decode_site(req(1, stored=CodecProfile("identity", 1.0, math.inf)))  # no gain, no cost: equal stalls
    assert tie.site == "node" and tie.node_stall_s == tie.client_stall_s
    for rate in (None, 0.0, math.nan):
        assert choose_decode_site(req(rate)).site == "node"
    assert choose_decode_site(req(1, stored=CodecProfile(RAW, 1.0, math.inf))).site == "node"
    assert choose_decode_site(req(1, client=0)).site == "node"
    assert choose_decode_site(req(1, stored=CodecProfile("x", 2.0, 0.0))).site == "node"  # unmeasured decode rate


def test_bad_requests_name_the_field():
    with pytest.raises(ValueError, match="node_workers"):
        req(1, node=0)
    with pytest.raises(ValueError, match="client_workers"):
        req(1, client=-1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1.0), min_size=1, max_size=4), st.integers(1, 40), st.floats(0, 0.5))
def test_pipeline_stall_is_bottleneck_times_layers_plus_the_rest(stages, layers, compute):
    """A tandem pipeline of constant stages: F(L) = Σ t_j + (L − 1)·max t_j over the stages and the compute."""
    times = [*stages, compute]
    expected = max(0.0, sum(times) + (layers - 1) * max(times) - layers * compute)
    assert pipeline_stall(stages, layers, compute) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_the_clients_own_measured_decode_rate_is_used_for_its_side():
    """A client that decodes far slower than the node (a busy engine host) loses even a slow link's choice."""
    fast_client = choose_decode_site(req(1))
    assert fast_client.site == "client"
    slow = DecodeSiteRequest(1 * GBPS, PAYLOAD, 32, ZSTD, 4, 2, 0.0, client_decode_bytes_per_s_per_core=ZSTD.decode_bytes_per_s_per_core / 100)
    site = choose_decode_site(slow)
    assert site.site == "node" and site.client_stall_s > fast_client.client_stall_s


def test_decoded_copies_in_the_node_take_its_decode_off_the_scale():
    """A fast link, decoders slower than it on both sides, the node's with fewer workers: the client wins, unless the
    node holds decoded copies of the chunks, when the node's side is the raw link alone."""
    slow = CodecProfile("zstd", 1.5, 0.2e9)
    base = DecodeSiteRequest(40 * GBPS, PAYLOAD, 32, slow, 1, 2, 0.0)
    assert choose_decode_site(base).site == "client"
    half = choose_decode_site(DecodeSiteRequest(**{**base.__dict__, "node_decoded_fraction": 0.5}))
    whole = choose_decode_site(DecodeSiteRequest(**{**base.__dict__, "node_decoded_fraction": 1.0}))
    assert whole.site == "node" and whole.node_stall_s < half.node_stall_s < choose_decode_site(base).node_stall_s
    assert whole.node_stall_s == pytest.approx(PAYLOAD / (40 * GBPS), rel=1e-9)  # nothing decoded: the raw bytes on the link
    with pytest.raises(ValueError, match="node_decoded_fraction"):
        DecodeSiteRequest(**{**base.__dict__, "node_decoded_fraction": 1.5})
