"""SPEC §3 rules 1, 3-5 and 11 between two brokers on one engine (two processes, as far as
the engine can tell; SPEC §10 rule 1): what one gives back, lets expire or never asks
for again is another's to receive, promptly, and each visible message goes to one
receiver at a time. The memory backend has one process only: both handles share it.

Bounds are generous (a shared CI machine): they tell "promptly" from "never" and from
"after a whole safety poll", not milliseconds.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator

import pytest

import fairq


@pytest.fixture
async def other(
    live_broker: fairq.Broker, url: str, backend_name: str
) -> AsyncIterator[fairq.Broker]:
    """A second broker on the same engine and namespace."""
    if backend_name == "memory":
        yield live_broker
        return
    b = await fairq.connect(url)
    try:
        yield b
    finally:
        await b.close()


async def test_a_send_wakes_another_brokers_long_poll(
    live_broker: fairq.Broker, other: fairq.Broker
) -> None:
    q = await live_broker.declare_queue("wake")
    waiter = asyncio.create_task(other.queue("wake").receive(wait=10))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    await q.send(b"x")
    (got,) = await asyncio.wait_for(waiter, 10)
    assert got.body == b"x"
    assert time.monotonic() - started < 2.0


async def test_a_lease_that_runs_out_is_another_brokers_to_receive(
    live_broker: fairq.Broker, other: fairq.Broker
) -> None:
    """The first broker stays open and never asks again: its lease's end makes the
    message visible to the other broker, attempt 2; the old receipt is lost."""
    q = await live_broker.declare_queue("expiry", visibility_timeout=30)
    await q.send(b"x")
    (first,) = await q.receive(visibility_timeout=0.5)
    started = time.monotonic()
    got = await other.queue("expiry").receive(wait=10)
    assert [m.attempt for m in got] == [2], "the other broker never got the message"
    assert time.monotonic() - started < 4.0
    with pytest.raises(fairq.LeaseLost):
        await first.ack()
    await got[0].ack()


async def test_a_nack_is_another_brokers_to_receive(
    live_broker: fairq.Broker, other: fairq.Broker
) -> None:
    q = await live_broker.declare_queue("given-back")
    await q.send(b"x")
    (first,) = await q.receive()
    waiter = asyncio.create_task(other.queue("given-back").receive(wait=10))
    await asyncio.sleep(0.3)
    await first.nack()
    got = await asyncio.wait_for(waiter, 12)
    assert [m.attempt for m in got] == [2], "the other broker's long poll got nothing"
    await got[0].ack()


async def test_a_broker_that_stopped_receiving_keeps_nothing_from_the_others(
    live_broker: fairq.Broker, other: fairq.Broker
) -> None:
    """One receive of one message, then nothing: the rest of the backlog is the other
    broker's (an engine that pushes messages to consumers must not leave them with one
    that no longer asks)."""
    q = await live_broker.declare_queue("backlog", visibility_timeout=60)
    await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(20)])
    (first,) = await q.receive()
    taker = other.queue("backlog")
    seen: list[fairq.Received] = []
    deadline = time.monotonic() + 10
    while len(seen) < 19 and time.monotonic() < deadline:
        seen += await taker.receive(max_messages=19 - len(seen), wait=1)
    assert sorted(m.body for m in seen) == sorted(f"m{i}".encode() for i in range(1, 20))
    await taker.ack_batch([m.receipt for m in seen])
    await first.ack()


async def test_competing_brokers_receive_each_message_once(
    live_broker: fairq.Broker, other: fairq.Broker
) -> None:
    n = 200
    q = await live_broker.declare_queue("compete", visibility_timeout=60)
    await q.send_batch([fairq.Outgoing(str(i)) for i in range(n)])
    seen: collections.Counter[bytes] = collections.Counter()

    async def consume(b: fairq.Broker) -> None:
        mine = b.queue("compete")
        empty = 0
        while empty < 3:
            got = await mine.receive(max_messages=7, wait=0.3)
            if not got:
                empty += 1
                continue
            empty = 0
            seen.update(m.body for m in got)
            await mine.ack_batch([m.receipt for m in got])

    await asyncio.wait_for(
        asyncio.gather(*(consume(b) for b in (live_broker, other) for _ in range(2))), 60
    )
    assert len(seen) == n and max(seen.values()) == 1


async def test_one_dedup_id_sent_at_once_from_two_brokers_is_stored_once(
    live_broker: fairq.Broker, other: fairq.Broker
) -> None:
    q = await live_broker.declare_queue("dedup-race")
    for r in range(5):
        ids = await asyncio.gather(
            *(
                b.queue("dedup-race").send(f"x{r}", dedup_id=f"k{r}")
                for b in (live_broker, other)
                for _ in range(3)
            )
        )
        assert len(set(ids)) == 1, f"round {r}: {len(set(ids))} messages stored for one dedup id"
    assert (await q.stats()).sent == 5


@pytest.mark.requires("overflow.block")
async def test_another_brokers_ack_wakes_a_blocked_send(
    live_broker: fairq.Broker, other: fairq.Broker
) -> None:
    q = await live_broker.declare_queue("full", max_length=1, overflow="block")
    await q.send(b"1")
    blocked = asyncio.create_task(q.send(b"2", timeout=10))
    await asyncio.sleep(0.3)
    assert not blocked.done()
    (m,) = await other.queue("full").receive()
    await m.ack()
    started = time.monotonic()
    await asyncio.wait_for(blocked, 10)
    assert time.monotonic() - started < 2.0


async def test_two_brokers_running_a_rooms_admitter_admit_at_its_rate_not_twice(
    live_broker: fairq.Broker, other: fairq.Broker
) -> None:
    """SPEC §8 rule 5: one admitter per room, wherever ``run_admitter`` runs."""
    room = await live_broker.waiting_room("sale", admit_rate=50.0)
    await room.join_many([f"f{i}" for i in range(1000)])
    rooms = (room, await other.room("sale"))
    tasks = [asyncio.create_task(r.run_admitter()) for r in rooms]
    try:
        await asyncio.sleep(0.5)
        before, started = (await room.stats()).admitted, time.monotonic()
        await asyncio.sleep(2.0)
        admitted, seconds = (await room.stats()).admitted - before, time.monotonic() - started
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert 0 < admitted <= 50.0 * seconds * 1.3 + 5, f"{admitted} admitted in {seconds:.1f} s"


async def test_a_slow_receiver_that_keeps_asking_leaves_the_rest_to_another_broker(
    live_broker: fairq.Broker, other: fairq.Broker, backend_name: str
) -> None:
    """One broker takes one message every 0.2 s, never idle for long; the other long-polls
    for ten at a time and gets the rest at once (a consumer with the URL's prefetch of 200
    held the backlog for the slow one: the other's polls came back empty)."""
    q = await live_broker.declare_queue("slow-and-fast", visibility_timeout=60)
    await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(60)])
    slow: list[bytes] = []
    fast: list[bytes] = []

    # RabbitMQ gives back what its consumer holds beyond one receive's worth once the
    # next delivery has waited SLOW_HELD seconds there: the window leaves room after that
    window = 3.0
    if backend_name == "amqp":
        from fairq.backends.amqp.leases import SLOW_HELD

        window = SLOW_HELD + 2.0

    async def one_at_a_time() -> None:
        for _ in range(int(window / 0.2)):
            for m in await q.receive():
                slow.append(m.body)
                await m.ack()
            await asyncio.sleep(0.2)

    async def ten_at_a_time() -> None:
        await asyncio.sleep(0.5)  # the slow one's consumer is running by then
        mine = other.queue("slow-and-fast")
        deadline = time.monotonic() + window
        while time.monotonic() < deadline and len(slow) + len(fast) < 60:
            got = await mine.receive(max_messages=10, wait=0.5)
            fast.extend(m.body for m in got)
            await mine.ack_batch([m.receipt for m in got])

    await asyncio.wait_for(asyncio.gather(one_at_a_time(), ten_at_a_time()), 30)
    assert len(slow) + len(fast) == len(set(slow + fast))
    assert len(fast) >= 40, f"the fast broker got {len(fast)}, the slow one {len(slow)}"
