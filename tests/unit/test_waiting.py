"""``WaitSlots.run``: a waiting request's work ends with the server's stop where it waits
(``ShuttingDown``), an engine call already on its way keeps its answer, and a cancelled
request cancels its work."""

from __future__ import annotations

import asyncio

import pytest

import fairq
from fairq.http import waiting
from fairq.http.waiting import ShuttingDown, WaitSlots


async def test_a_stop_ends_a_long_poll_where_it_waits() -> None:
    async with await fairq.connect("memory://") as broker:
        q = await broker.declare_queue("idle")
        slots = WaitSlots(10)
        work = asyncio.create_task(slots.run(q.receive(wait=30)))
        await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        started = loop.time()
        slots.close()
        with pytest.raises(ShuttingDown):
            await asyncio.wait_for(work, 2)
        assert loop.time() - started < 0.5, "ended at once, not after the grace period"
        assert (await q.stats()).in_flight == 0


async def test_a_send_whose_engine_call_is_on_its_way_keeps_its_answer() -> None:
    """The stop comes while the send's engine call runs (a slow engine): the send is not
    cut off, it stores, and the request answers so — not 503 after storing."""
    async with await fairq.connect("memory://") as broker:
        q = await broker.declare_queue("slow")
        real = broker.backend.send

        async def slow_send(*args: object) -> list[str]:
            await asyncio.sleep(0.3)
            return await real(*args)  # type: ignore[arg-type]

        broker.backend.send = slow_send  # type: ignore[method-assign]
        slots = WaitSlots(10)
        work = asyncio.create_task(slots.run(q.send(b"x", timeout=10)))
        await asyncio.sleep(0.05)
        slots.close()
        assert isinstance(await asyncio.wait_for(work, 2), str), "the stored id, not a 503"
        assert (await q.stats()).visible == 1


async def test_work_that_does_not_stop_is_cancelled_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waiting, "STOP_GRACE", 0.1)
    slots = WaitSlots(10)
    work = asyncio.create_task(slots.run(asyncio.sleep(30)))
    await asyncio.sleep(0.01)
    slots.close()
    with pytest.raises(ShuttingDown):
        await asyncio.wait_for(work, 2)


async def test_after_the_stop_a_request_answers_unless_it_has_to_wait() -> None:
    async with await fairq.connect("memory://") as broker:
        q = await broker.declare_queue("q")
        await q.send(b"ready")
        slots = WaitSlots(10)
        slots.close()
        (got,) = await slots.run(q.receive(wait=5))
        assert got.body == b"ready", "a message there at once is answered"
        with pytest.raises(ShuttingDown):  # nothing there: it would wait
            await asyncio.wait_for(slots.run(q.receive(wait=5)), 2)


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
