"""The transfer plan is a pure function: mode, staging and compute window from numbers alone."""

from __future__ import annotations

import pytest

from protocol.errors import ErrorCode, S3Error
from protocol.wire import Descriptor, Mode, Target, TransportKind
from storage_server.plan import Staging, check_chunk_sizes, plan_transfer

S = 1024  # per-layer chunk bytes
L = 4
HTTP = Staging(in_server=True, pieces_in_rotation=2, max_piece_bytes=1 << 30)
SHM = Staging(in_server=False)


def descriptor(n: int, mode: Mode = Mode.AUTO, window: tuple[float, ...] = ()) -> Descriptor:
    return Descriptor([f"k{i}" for i in range(n)], L, 16, S, Target(TransportKind.HTTP, length=n * L * S), window, mode)


def plan(d: Descriptor, staging: Staging = SHM, theta: int = 10 * L * S, budget: int = 1 << 30, pool: bool = False, default: float = 0.0):
    return plan_transfer(d, theta_bytes=theta, staging=staging, staging_budget=budget, pool_enabled=pool, default_compute_per_layer_s=default)


def test_auto_mode_goes_chunkwise_below_theta_and_layerwise_at_or_above_it():
    assert plan(descriptor(9)).mode == Mode.CHUNKWISE
    assert plan(descriptor(10)).mode == Mode.LAYERWISE
    assert plan(descriptor(11)).mode == Mode.LAYERWISE


def test_an_explicit_mode_is_kept():
    assert plan(descriptor(1, Mode.LAYERWISE)).mode == Mode.LAYERWISE
    assert plan(descriptor(100, Mode.CHUNKWISE)).mode == Mode.CHUNKWISE


def test_shm_stages_nothing_in_the_server():
    assert plan(descriptor(100, Mode.CHUNKWISE), SHM, budget=1).staging_bytes == 0
    assert plan(descriptor(100, Mode.LAYERWISE), SHM, budget=1).staging_bytes == 0


def test_http_stages_two_pieces_layerwise_and_the_whole_payload_chunkwise():
    p = plan(descriptor(3, Mode.LAYERWISE), HTTP)
    assert p.piece_chunks == 3 and p.staging_bytes == 2 * 3 * S  # a small layer is one piece
    assert plan(descriptor(3, Mode.CHUNKWISE), HTTP).staging_bytes == L * 3 * S


def test_http_pieces_are_runs_of_whole_chunks_bounded_by_the_piece_size_and_half_the_budget():
    small_pieces = Staging(in_server=True, pieces_in_rotation=2, max_piece_bytes=2 * S + 1)
    p = plan(descriptor(5, Mode.LAYERWISE), small_pieces)
    assert p.piece_chunks == 2 and p.staging_bytes == 2 * 2 * S
    p = plan(descriptor(100, Mode.LAYERWISE), HTTP, budget=6 * S)
    assert p.piece_chunks == 3 and p.staging_bytes == 6 * S  # never more than the budget, however large the layer


def test_a_chunk_slice_that_cannot_be_staged_within_the_budget_is_refused_naming_the_field():
    with pytest.raises(S3Error) as e:
        plan(descriptor(4, Mode.LAYERWISE), HTTP, budget=2 * S - 1)
    assert e.value.code == ErrorCode.KVInvalidDescriptor and e.value.extra["Field"] == "per_layer_chunk_bytes"
    assert plan(descriptor(4, Mode.LAYERWISE), SHM, budget=1).piece_chunks == 4  # shm stages nothing


def test_a_chunkwise_http_payload_larger_than_the_whole_budget_is_sent_layerwise():
    d = descriptor(8, Mode.CHUNKWISE)
    p = plan(d, HTTP, budget=d.payload_bytes - 1)
    assert p.mode == Mode.LAYERWISE and p.staging_bytes <= d.payload_bytes - 1
    assert plan(d, HTTP, budget=d.payload_bytes).mode == Mode.CHUNKWISE  # exactly fits: stays chunkwise


def test_only_layerwise_transfers_join_the_pool_and_only_when_there_is_one():
    assert plan(descriptor(100), pool=True).paced
    assert not plan(descriptor(1), pool=True).paced  # chunkwise bypasses the pool
    assert not plan(descriptor(100), pool=False).paced


def test_the_compute_window_is_the_mean_of_the_descriptor_or_the_default():
    assert plan(descriptor(100, window=(0.01, 0.03, 0.02, 0.04))).compute_per_layer_s == pytest.approx(0.025)
    assert plan(descriptor(100, window=(0.5,))).compute_per_layer_s == 0.5
    assert plan(descriptor(100), default=0.007).compute_per_layer_s == 0.007


def test_chunk_sizes_must_be_exactly_l_times_s_and_the_error_names_the_first_wrong_key():
    d = descriptor(3)
    check_chunk_sizes(d, [L * S] * 3)
    with pytest.raises(S3Error) as e:
        check_chunk_sizes(d, [L * S, L * S - 1, 0])
    assert e.value.code == ErrorCode.KVChunkSizeMismatch
    assert e.value.extra == {"Key": "k1", "ActualSize": str(L * S - 1), "ExpectedSize": str(L * S)}
