"""``WaitSlots.run``: a waiting request's work ends with the server's stop (``ShuttingDown``)
and with the request itself (a cancelled request cancels its work)."""

from __future__ import annotations

import asyncio

import pytest

from fairq.http.waiting import ShuttingDown, WaitSlots


async def test_a_stop_ends_the_work_that_waits() -> None:
    slots = WaitSlots(10)
    work = asyncio.create_task(slots.run(asyncio.sleep(30)))
    await asyncio.sleep(0.01)
    slots.close()
    with pytest.raises(ShuttingDown):
        await asyncio.wait_for(work, 2)


async def test_work_done_before_the_stop_keeps_its_answer() -> None:
    slots = WaitSlots(10)

    async def quick() -> str:
        return "done"

    assert await slots.run(quick()) == "done"
    slots.close()
    with pytest.raises(ShuttingDown):  # a request that would wait once the stop began
        await slots.run(quick())


async def test_a_cancelled_request_cancels_its_work() -> None:
    slots = WaitSlots(10)
    ended: list[str] = []

    async def long() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    request = asyncio.create_task(slots.run(long()))
    await asyncio.sleep(0.01)
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    assert ended == ["cancelled"], "the work ran on after its request was cancelled"
