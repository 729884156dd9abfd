"""A queue deleted by another process and declared again under the same name is a new
RabbitMQ queue: the broker cancels this process's consumer of the old one (``basic.cancel``),
and the feed consumes again at its next receive. A worker's receive takes only what its
consumer is pushed, so a stale consumer left it receiving nothing, for good (a push
subscription unsubscribed and made again while a worker delivered it).

And RabbitMQ 3.10 answers the delete of a quorum queue another process consumes before the
queue has stopped: declared again at once, the new queue lost every message sent to it
(confirmed). ``delete_queue`` returns a moment later when the queue had consumers."""

from __future__ import annotations

import asyncio
import time

import fairq


async def test_a_consumer_of_a_queue_made_anew_consumes_the_new_one(url: str) -> None:
    async with await fairq.connect(url) as one, await fairq.connect(url) as two:
        q = await one.declare_queue("made-anew")
        one.backend.consumer_window("made-anew", 4)  # as a worker of 4 slots does
        try:
            await q.send(b"old")
            deadline = time.monotonic() + 10
            got: list[fairq.Received] = []
            while not got:
                assert time.monotonic() < deadline
                got = await q.receive(max_messages=4, wait=0.2)
            await got[0].ack()
            assert await two.delete_queue("made-anew")
            await two.declare_queue("made-anew")
            await two.queue("made-anew").send_batch([fairq.Outgoing(f"new-{i}") for i in range(3)])
            bodies: list[bytes] = []
            deadline = time.monotonic() + 10
            while len(bodies) < 3:
                assert time.monotonic() < deadline, f"the old consumer got {bodies}"
                try:
                    msgs = await q.receive(max_messages=4, wait=0.2)
                except fairq.QueueNotFound:  # this process had not seen the new one yet
                    await asyncio.sleep(0.1)
                    continue
                for m in msgs:
                    bodies.append(m.body)
                    await m.ack()
            assert sorted(bodies) == [b"new-0", b"new-1", b"new-2"]
        finally:
            one.backend.consumer_window("made-anew", -4)
