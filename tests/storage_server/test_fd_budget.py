"""The transfers' descriptor budget: held, waited for, and the extra descriptors a kv-get takes after its pin."""

from __future__ import annotations

import asyncio

import pytest

from protocol.errors import S3Error
from storage_server.fd_budget import FdBudget


def test_a_kv_get_takes_more_descriptors_only_where_they_fit_and_gives_them_back():
    async def go():
        budget = FdBudget(limit=lambda: 20)  # 10 for transfers
        async with budget.hold(3, 2):  # 6 held
            assert budget.try_take(5) == 0 and budget.held == 6  # 11 > 10: nothing taken, nothing waits
            assert budget.try_take(4) == 4 and budget.held == 10
            waiter = asyncio.ensure_future(_hold_one(budget))
            await asyncio.sleep(0.05)
            assert not waiter.done() and budget.waiting == 1  # no room until the extra ones come back
            await budget.give(4)
            assert budget.held <= 10
            await asyncio.wait_for(waiter, 30)  # woken by the give
        assert budget.held == 0 and budget.try_take(11) == 0 and budget.try_take(0) == 0

    asyncio.run(go())


async def _hold_one(budget: FdBudget) -> None:
    async with budget.hold(2, 2):
        pass


def test_a_transfer_that_never_fits_is_refused_up_front():
    with pytest.raises(S3Error) as e:
        FdBudget(limit=lambda: 8).need(3, 2)
    assert e.value.code.name == "KVTooManyKeys"


def test_a_capacity_tiers_stream_decode_descriptors_are_held_with_the_chunks_and_never_block_forever():
    async def go():
        budget = FdBudget(limit=lambda: 20)  # 10 for transfers
        async with budget.hold(2, 1, extra=4):
            assert budget.held == 6
        async with budget.hold(4, 2, extra=8):  # 8 + 8 could never fit: the extra ones only up to the total
            assert budget.held == 10
        assert budget.held == 0

    asyncio.run(go())
