"""Load budgets on the storage server: a layerwise kv-get is cut at the first layer boundary it cannot make.

Paced: the pool sends a layer per two seconds (no burst credit), so the server knows at once that
layer 1 cannot start within a 0.3 s budget, delivers layer 0 and ends the transfer with
``KVLoadBudgetExceeded`` (the lease freed); without a budget the same load waits and completes.
Stalled: no pool, a gate holds the transfer before layer 1 until the budget is spent; layer 1
then goes (it was started in time) and the transfer is cut at the next boundary.
Longest prefix: asked with a ``LoadBudget``, the paced node's kv-lookup answers how many leading
chunks it expects to land within the budget, and a kv-get of just those completes within it.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from inprocess import gated_node
from kvsupport import client, keys_for, make_chunks, reference, rpc, run, tiny_layout
from support import ServerProcess, boto_client, make_tenants, write_config

from client_sdk import kv_get
from client_sdk.stream import finish_after
from protocol.errors import ErrorCode, S3Error
from protocol.kv_http import LoadBudget

N = 8
BUDGET = 0.3


@pytest.fixture
def node_clock_only(monkeypatch):
    """The node's cut alone: the client's own guard (it gives up on its clock a moment before the budget, and the
    node's clock starts later, on arrival) moved out of the way, so what the node did reaches the test."""
    monkeypatch.setattr(kv_get, "BUDGET_REACTION_S", -60.0)


async def _collect(c, keys, layout, expected, transport: str, budget: float) -> tuple[list[int], S3Error | None]:
    """The layers that arrived (checked against the reference) and the error that ended the stream, if any."""
    seen: list[int] = []
    try:
        async with c.fetch_layers(keys, layout, transport=transport, mode="layerwise", load_budget_s=budget) as layers:
            async for idx, view in layers:
                assert np.array_equal(np.frombuffer(view, np.uint8), expected[idx])
                seen.append(idx)
    except S3Error as e:
        return seen, e
    return seen, None


async def _settled_status(sock: str, timeout_s: float = 30.0) -> dict:
    """The node's status once its cut transfer has been cleaned up: the client has the ERROR frame a moment before
    the node drops the transfer and its lease (a loaded machine widens that moment); bounded, then as it is."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = rpc(sock, "status")
        if (status["transfers_active"] == [] and status["bandwidth"]["leases"] == {}) or time.monotonic() > deadline:
            return status
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("transport", ["shm", "http"])
def test_a_paced_load_is_cut_where_its_next_layer_cannot_start_in_time_and_waits_without_a_budget(tmp_path, transport, node_clock_only):
    tenant = make_tenants("t")[0]
    sock = tmp_path / "ss.sock"
    layout = tiny_layout(64, num_layers=2)
    gbps = N * layout.per_layer_chunk_bytes * 8 / 1e9 / 2  # a layer per two seconds
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra=(
        f'\n[storage_server]\nsocket = "{sock}"\ntheta_bytes = 0\n'
        f'\n[bandwidth]\ncapacity_gbps = {gbps!r}\npolicy = "equal"\nburst_layers = 0\n'))
    proc = ServerProcess(config).start()
    try:
        boto_client(proc.endpoint, tenant).create_bucket(Bucket="budget")
        keys, chunks = keys_for(layout, N, "budget"), make_chunks(layout, N, seed=5)
        expected = reference(layout, chunks)

        async def scenario():
            async with client(proc, tenant, "budget") as c:
                await c.put_chunks(keys, chunks, layout)
                cut = await _collect(c, keys, layout, expected, transport, BUDGET)
                status = await _settled_status(str(sock))
                whole = await _collect(c, keys, layout, expected, transport, 0.0)
                # The longest prefix the node expects to land within 4 s: at 4 chunks' layer per second, two
                # layers, no burst, a 10 ms epoch and 75% of the budget, (0.75·4 − 0.01)·4 / 2 = 5.98 → 5 chunks.
                reply = await c.lookup_within(keys, LoadBudget(4.0, layout.num_layers, layout.per_layer_chunk_bytes))
                skipped = await c.lookup_within(keys, LoadBudget(4.0, layout.num_layers, layout.per_layer_chunk_bytes, skip=2))
                part = await _collect(c, keys[:reply.deliverable], layout, reference(layout, chunks[:reply.deliverable]), transport, 4.0)
                try:  # a budget that is no budget is refused by the gateway, naming the header
                    await c.lookup_within(keys, LoadBudget(0.0, layout.num_layers, layout.per_layer_chunk_bytes))
                except S3Error as e:
                    assert e.code == ErrorCode.InvalidArgument and "x-oc-load-budget" in e.message, e
                else:
                    raise AssertionError("a zero load budget was accepted")
                return cut, status, whole, reply, skipped, part

        (seen, error), status, whole, reply, skipped, part = run(scenario())
        assert (reply.hits, reply.deliverable) == (N, 5), reply
        assert skipped.deliverable == 7, "chunks the engine already holds cost no time"
        assert part == ([0, 1], None), "the deliverable prefix loads whole within the budget"
        assert seen == [0], "layer 0 starts in time and is delivered; layer 1 is not sent"
        assert error is not None and error.code == ErrorCode.KVLoadBudgetExceeded, error
        assert "layer boundary 1" in error.message and "load_budget_s" in error.message
        assert status["transfers_active"] == [] and status["bandwidth"]["leases"] == {}, status
        assert whole == ([0, 1], None), "without a budget the paced load waits and completes"
    finally:
        proc.stop()


def test_a_transfer_stalled_past_its_budget_is_cut_at_the_next_layer_boundary(tmp_path, node_clock_only):
    tenant, layout, gate, node = gated_node(tmp_path, "s")
    try:
        boto_client(node.endpoint, tenant).create_bucket(Bucket="stall")
        keys, chunks = keys_for(layout, N, "stall"), make_chunks(layout, N, seed=6)
        expected = reference(layout, chunks)

        async def stalled(budget: float):
            gate.hold_before(1)
            fetch = asyncio.ensure_future(_collect(c, keys, layout, expected, "shm", budget))
            assert await asyncio.to_thread(gate.wait_held), "the transfer never reached the gate"
            held_at = time.monotonic()
            while time.monotonic() - held_at <= BUDGET:  # the server received the kv-get before it was held
                await asyncio.sleep(0.02)
            gate.open()
            return await fetch

        async def scenario():
            nonlocal c
            async with client(node, tenant, "stall") as c:
                await c.put_chunks(keys, chunks, layout)
                return await stalled(BUDGET), await stalled(0.0)

        c = None
        (seen, error), whole = run(scenario())
        assert seen == [0, 1], "layer 1 started in time (before the stall ended it) and is delivered"
        assert error is not None and error.code == ErrorCode.KVLoadBudgetExceeded and "layer boundary 2" in error.message, error
        assert whole == ([0, 1, 2, 3], None), "without a budget the stalled load completes"
    finally:
        node.stop()


def test_the_client_gives_up_on_its_own_clock_while_the_node_is_still_stalled(tmp_path):
    """The budget is the engine's: a node stalled before layer 1 has not cut the transfer yet (the gate is still
    held), and the client has already given up with KVLoadBudgetExceeded, so the engine's recompute can begin."""
    tenant, layout, gate, node = gated_node(tmp_path, "g")
    try:
        boto_client(node.endpoint, tenant).create_bucket(Bucket="guard")
        keys, chunks = keys_for(layout, N, "guard"), make_chunks(layout, N, seed=7)

        async def scenario():
            async with client(node, tenant, "guard") as c:
                await c.put_chunks(keys, chunks, layout)
                gate.hold_before(1)
                got = await _collect(c, keys, layout, reference(layout, chunks), "shm", BUDGET)
                still_held = not gate.released.is_set()  # the node cannot have cut it: its check for layer 1 passed before the gate
                gate.open()
                return got, still_held

        (seen, error), still_held = run(scenario())
        assert still_held, "the client's error came while the node was still stalled"
        assert seen in ([], [0]), seen  # layer 0 before the gate (none if the node was slower than the budget)
        assert error is not None and error.code == ErrorCode.KVLoadBudgetExceeded, error
        assert f"layer {len(seen)} " in error.message and "this process's clock" in error.message, error.message
    finally:
        node.stop()


def test_a_load_whose_pace_cannot_finish_in_the_budget_is_given_up_at_once():
    # Layers landing 10 ms apart from 5 ms on: 8 layers end at 75 ms.
    assert not finish_after([0.005], 8, 0.05), "one arrival has no pace yet"
    assert finish_after([0.005, 0.015], 8, 0.05)
    assert not finish_after([0.005, 0.015], 8, 0.08)
    assert not finish_after([0.005 + 0.01 * i for i in range(8)], 8, 0.01), "every layer is in: nothing is left to give up"
