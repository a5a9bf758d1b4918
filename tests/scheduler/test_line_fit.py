"""The oracle's learnt line (fixed cost + time per byte) and a node's shared landing link (pure functions)."""

from __future__ import annotations

import pytest

from scheduler import PathRequest, choose_path
from scheduler.oracle import LineFit, LinkView, Tier
from scheduler.paths import OracleView, Source, SourceKind


def test_no_sample_no_line():
    assert LineFit(0.3).line(0.01) is None


def test_samples_of_several_sizes_give_the_fixed_cost_and_the_time_per_byte():
    fit = LineFit(0.3, prior_weight=0.0)
    for x in (1e5, 1e6, 4e5, 2e6, 3e5):
        fit.add(x, 0.014 + x * 5e-9)
    intercept, slope = fit.line(prior_y=0.5)  # a prior of no weight changes nothing
    assert intercept == pytest.approx(0.014) and slope == pytest.approx(5e-9)


def test_one_size_only_the_prior_point_pins_the_line():
    # Every fetch so far moved 6 MB in 0.155 s; a fetch of nothing costs 0.0095 s (one GET's first byte): the line goes
    # through both, so a one-chunk fetch is not charged the big fetches' per-byte time as a fixed cost.
    fit = LineFit(0.3)
    for _ in range(3):
        fit.add(6e6, 0.155)
    intercept, slope = fit.line(prior_y=0.0095)
    assert intercept == pytest.approx(0.0095) and slope == pytest.approx((0.155 - 0.0095) / 6e6)
    assert intercept + slope * 2.6e5 < 0.02


def test_the_newest_samples_weigh_most_once_past_the_first_few():
    fit = LineFit(0.5, prior_weight=0.0)
    for x in (1e6, 2e6, 1e6, 2e6):
        fit.add(x, x * 1e-8)  # slow
    for x in (1e6, 2e6) * 6:
        fit.add(x, x * 2e-9)  # then five times faster
    _, slope = fit.line(0.0)
    assert slope == pytest.approx(2e-9, rel=0.05)


def test_a_line_with_no_positive_slope_says_nothing_and_bad_samples_are_refused():
    fit = LineFit(0.3, prior_weight=0.0)
    fit.add(1e6, 0.2)
    fit.add(2e6, 0.1)  # bigger took less: noise, no rate to learn
    assert fit.line(0.0) is None
    with pytest.raises(ValueError):
        fit.add(-1.0, 0.1)
    with pytest.raises(ValueError):
        fit.add(1.0, float("nan"))


def _view(ingest_bytes_per_s: float | None) -> OracleView:
    """A's paths for a prefix whose front is warm on peer B (paced 16 MB/s, 50 ms to set up) and the upstream (44 MB/s
    after a 14 ms first byte), both landing in A's cache; with a rate, A's landing is one link both cross."""
    landing = ("ingest->a",) if ingest_bytes_per_s else ()
    links = {"b->a": LinkView("b->a", 16e6, 0.0, Tier.SAME_ZONE), "upstream->a": LinkView("upstream->a", 44e6, 0.0, Tier.CROSS_ZONE),
             "a->host-a": LinkView("a->host-a", 1e9, 0.0, Tier.SAME_HOST)}
    if ingest_bytes_per_s:
        links["ingest->a"] = LinkView("ingest->a", ingest_bytes_per_s, 0.0, Tier.SAME_HOST)
    sources = (Source("peer:b", SourceKind.PEER, 24, ("b->a", *landing, "a->host-a"), startup_s=0.05, store_and_forward=True),
               Source("upstream@a", SourceKind.UPSTREAM, 24, ("upstream->a", *landing, "a->host-a"), startup_s=0.014, store_and_forward=True))
    return OracleView(sources, links)


def test_a_split_gains_nothing_when_the_nodes_landing_is_what_binds():
    request = PathRequest(24, 262144.0, 32)
    # Each link apart: the peer's share runs beside the upstream's, a split looks faster than the upstream alone.
    assert choose_path(request, _view(None)).sources == ("peer:b", "upstream@a")
    # Both land at 44 MB/s together (the node, not either link, is the bottleneck): a split only adds the peer's
    # set-up, so the upstream alone is chosen, and its prediction is the landing's time for every byte.
    alone = choose_path(request, _view(44e6))
    assert alone.sources == ("upstream@a",)
    assert alone.first_layer_s == pytest.approx(0.014 + 24 * 262144 / 44e6, rel=0.02)
