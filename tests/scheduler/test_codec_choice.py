"""The break-even model that picks a codec per transfer: fast link → raw, slow link → compressed, lossy only where
allowed, ties to raw then lossless, unknown rates raw, and never worse than any fixed choice in the model."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.codec_choice import RAW, CodecProfile, CodecRequest, break_even_rate, choose_codec, modelled_stall

GBPS = 1e9 / 8
GB = 1e9
LOSSLESS = CodecProfile("shuffle-zstd", 1.35, 1.5 * GB)
INT8 = CodecProfile("int8-zstd", 2.6, 1.2 * GB, lossy=True)
INT4 = CodecProfile("int4", 3.9, 2.0 * GB, lossy=True)
PROFILES = [LOSSLESS, INT8, INT4]
PAYLOAD = 32 * 64 * 1024 * 1024  # 32 layers of 64 MiB


def req(gbps: float | None, workers: int = 4, lossy: bool = False, compute: float = 0.0, layers: int = 32, payload: float = PAYLOAD):
    rate = None if gbps is None else gbps * GBPS
    return CodecRequest(rate, payload, layers, workers, allow_lossy=lossy, compute_per_layer_s=compute)


def test_fast_link_sends_raw():
    choice = choose_codec(req(400, workers=2, lossy=True), PROFILES)  # 50 GB/s: faster than 2 cores decode anything
    assert choice.codec == RAW and choice.stall_s == choice.raw_stall_s
    assert all(s >= choice.stall_s for _, s in choice.stalls)


def test_slow_link_sends_compressed():
    lossless = choose_codec(req(1), PROFILES)
    assert lossless.codec == LOSSLESS.name and lossless.stall_s < lossless.raw_stall_s
    # Link-bound: the stall shrinks by about the ratio.
    assert lossless.modelled_speedup == pytest.approx(LOSSLESS.ratio, rel=0.02)
    lossy = choose_codec(req(1, lossy=True), PROFILES)
    assert lossy.codec == INT4.name and lossy.modelled_speedup == pytest.approx(INT4.ratio, rel=0.05)


def test_lossy_codecs_only_where_the_namespace_allows_them():
    for gbps in (0.5, 1, 5, 10, 20, 40):
        strict = choose_codec(req(gbps, lossy=False), PROFILES)
        assert strict.codec in (RAW, LOSSLESS.name)
        assert {name for name, _ in strict.stalls} <= {RAW, LOSSLESS.name}
    assert choose_codec(req(1, lossy=False), [INT8, INT4]).codec == RAW  # only lossy ones measured: raw


def test_ties_go_to_raw_then_lossless():
    free = CodecProfile("identity", 1.0, math.inf)  # same wire bytes, no decode cost: exactly raw's stall
    choice = choose_codec(req(1), [free])
    assert dict(choice.stalls)["identity"] == choice.raw_stall_s and choice.codec == RAW
    # Decode-bound on both: equal stalls; the lossless one wins the tie.
    twin_lossy = CodecProfile("int8-twin", LOSSLESS.ratio, LOSSLESS.decode_bytes_per_s_per_core, lossy=True)
    pick = choose_codec(req(1, lossy=True), [twin_lossy, LOSSLESS])
    assert pick.codec == LOSSLESS.name
    assert dict(pick.stalls)["int8-twin"] == pytest.approx(pick.stall_s)


@pytest.mark.parametrize("rate", [None, 0.0, math.nan, -5.0])
def test_unknown_or_zero_rate_sends_raw_without_a_model(rate):
    choice = choose_codec(CodecRequest(rate, PAYLOAD, 32, 4, allow_lossy=True), PROFILES)
    assert choice.codec == RAW and "unknown" in choice.reason and choice.stalls == ()


def test_infinite_rate_empty_payload_and_no_workers_send_raw():
    assert choose_codec(req(math.inf, lossy=True), PROFILES).codec == RAW
    empty = choose_codec(req(1, lossy=True, payload=0), PROFILES)
    assert empty.codec == RAW and empty.stall_s == 0
    none = choose_codec(req(0.1, workers=0, lossy=True), PROFILES)
    assert none.codec == RAW and "no decode workers" in none.reason


def test_unmeasured_codecs_are_never_chosen():
    for bad in (CodecProfile("x", 4.0, 0.0), CodecProfile("y", 4.0, math.nan), CodecProfile("z", 0.0, GB), CodecProfile("w", math.inf, GB)):
        assert choose_codec(req(0.1, lossy=True), [bad]).codec == RAW


def test_break_even_rate_is_where_raw_and_the_codec_swap():
    workers = 4
    edge = break_even_rate(LOSSLESS, workers)
    assert edge == LOSSLESS.decode_bytes_per_s_per_core * workers
    many = dict(layers=512, payload=512 * 8 * 1024 * 1024)  # steady state: fill and drain are negligible
    below = CodecRequest(0.8 * edge, many["payload"], many["layers"], workers)
    above = CodecRequest(1.25 * edge, many["payload"], many["layers"], workers)
    assert choose_codec(below, [LOSSLESS]).codec == LOSSLESS.name
    assert choose_codec(above, [LOSSLESS]).codec == RAW
    assert break_even_rate(CodecProfile("flat", 1.0, GB), workers) == 0 and break_even_rate(LOSSLESS, 0) == 0


def test_compute_window_hides_a_fast_enough_raw_load():
    # Raw at 10 Gbps moves a 64 MiB layer in ~54 ms; a 60 ms compute window hides all but the first layer.
    choice = choose_codec(req(10, compute=0.060), [LOSSLESS])
    per_layer = PAYLOAD / 32 / (10 * GBPS)
    assert choice.raw_stall_s == pytest.approx(per_layer)
    assert choice.stall_s <= choice.raw_stall_s


def test_more_decode_workers_move_the_choice_towards_compression():
    picks = [choose_codec(req(20, workers=w), [LOSSLESS]).codec for w in (1, 2, 4, 8)]
    assert picks[0] == RAW and picks[-1] == LOSSLESS.name
    first = picks.index(LOSSLESS.name)
    assert all(p == LOSSLESS.name for p in picks[first:])


def test_profiles_are_named_once():
    with pytest.raises(ValueError, match="profiles: codec 'int4' named twice"):
        choose_codec(req(1), [INT4, INT4])


profiles_st = st.lists(st.builds(CodecProfile, st.text("abcdef", min_size=1, max_size=4),
                                 st.floats(0.5, 8.0), st.floats(1e7, 1e11), st.booleans()),
                       max_size=5, unique_by=lambda p: p.name)


@settings(max_examples=300, deadline=None)
@given(profiles_st, st.floats(1e6, 1e12), st.floats(1, 1e10), st.integers(1, 80), st.integers(0, 16), st.booleans(),
       st.floats(0, 0.1))
def test_never_worse_than_any_allowed_fixed_choice(profiles, rate, payload, layers, workers, lossy, compute):
    r = CodecRequest(rate, payload, layers, workers, allow_lossy=lossy, compute_per_layer_s=compute)
    choice = choose_codec(r, profiles)
    allowed = [p for p in profiles if lossy or not p.lossy]
    assert choice.stall_s <= choice.raw_stall_s
    for p in allowed:
        assert choice.stall_s <= modelled_stall(p, r) * (1 + 1e-9) or workers == 0
    chosen = next((p for p in profiles if p.name == choice.codec), None)
    assert choice.codec == RAW or (chosen is not None and (lossy or not chosen.lossy))


@settings(max_examples=300, deadline=None)
@given(st.floats(1e6, 1e12), st.floats(1, 1e10), st.integers(1, 80), st.integers(1, 16), st.floats(0.5, 8.0), st.floats(1e7, 1e11))
def test_without_compute_the_stall_is_the_two_stage_pipeline_formula(rate, payload, layers, workers, ratio, decode):
    p = CodecProfile("c", ratio, decode)
    s = payload / layers
    x, d = s / ratio / rate, s / (decode * workers)
    assert modelled_stall(p, CodecRequest(rate, payload, layers, workers)) == pytest.approx(x + d + (layers - 1) * max(x, d), rel=1e-9)


def test_decode_while_fetching_only_where_the_decoders_keep_up_with_the_raw_equivalent_arrival_rate():
    from scheduler.codec_choice import decode_while_fetching
    assert decode_while_fetching(50e6, 1.45, 0.4e9)  # zstd behind a 50 MB/s upstream: 73 MB/s raw-equivalent
    assert not decode_while_fetching(150e6, 4.87, 0.15e9)  # int4+zstd unpaced: 730 MB/s raw-equivalent
    assert decode_while_fetching(100e6, 2.0, 200e6) and not decode_while_fetching(100e6, 2.0, 199e6)  # the boundary
    assert decode_while_fetching(100e6, 0.5, 100e6)  # a ratio below 1 counts as 1 (never fewer raw bytes than stored)
    for unknown in (None, 0.0, math.nan):  # no figure yet: decode while fetching (that measures the decoders)
        assert decode_while_fetching(unknown, 4.0, 1e6) and decode_while_fetching(1e12, 4.0, unknown)
