"""What a process's consumer gives back (docs/rabbitmq.md, "A consumer that holds more
than its process asks for"), at the edges a review found: an ack made while the
consumer's cancel is on its way is sent once it returns, not left for the next ack or the
close; what a slow release kept for the process goes back once it stops asking."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import fairq


async def test_an_ack_made_while_a_consumer_is_cancelled_is_sent(
    broker: fairq.Broker, url: str
) -> None:
    q = await broker.declare_queue("acks", visibility_timeout=60)
    await q.send(b"m")
    (m,) = await q.receive()
    backend: Any = broker.backend
    feed = backend._feeds["acks"]
    feed.prefetch = 1
    resizing = asyncio.create_task(feed.resize(5))  # what a bigger receive does: re-consume
    for _ in range(1000):
        if feed._holding:
            break  # the cancel is on its way
        await asyncio.sleep(0)
    assert feed._holding
    await m.ack()
    await resizing
    for _ in range(100):
        if not feed._acks:
            break
        await asyncio.sleep(0.02)
    assert feed._acks == [], "the ack was never sent"
    async with await fairq.connect(url) as other:  # the broker has it: nothing comes back
        assert await other.queue("acks").receive(wait=1) == []


async def test_what_a_slow_release_kept_goes_back_once_its_process_stops_asking(
    broker: fairq.Broker, url: str
) -> None:
    from fairq.backends.amqp.leases import SLOW_HELD

    q = await broker.declare_queue("kept", visibility_timeout=60)
    await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(30)])
    slow = 0
    deadline = time.monotonic() + SLOW_HELD + 1.5
    while time.monotonic() < deadline:  # one at a time: the release keeps one for it
        for m in await q.receive():
            await m.ack()
            slow += 1
        await asyncio.sleep(0.3)
    # then it asks for nothing more; another process gets every message left
    got: set[bytes] = set()
    async with await fairq.connect(url) as other:
        mine = other.queue("kept")
        end = time.monotonic() + 15
        while len(got) < 30 - slow and time.monotonic() < end:
            batch = await mine.receive(max_messages=10, wait=1)
            got.update(m.body for m in batch)
            await mine.ack_batch([m.receipt for m in batch])
    assert len(got) == 30 - slow, f"{30 - slow - len(got)} stayed with the first process"
