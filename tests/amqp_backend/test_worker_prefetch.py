"""A worker on RabbitMQ holds no more deliveries than it can run: its consumer's prefetch is
the worker's concurrency for the queue, not the URL's ``prefetch`` (200). A held delivery
counts an attempt when the process dies, started or not, and is out of other workers'
reach: with 200, a second worker got nothing of a backlog the first one sat on."""

from __future__ import annotations

import asyncio

import fairq


async def test_a_second_consumer_gets_what_a_busy_worker_cannot_run(url: str) -> None:
    async with await fairq.connect(url) as one, await fairq.connect(url) as two:
        q = await one.declare_queue("backlog")
        await q.send_batch([fairq.Outgoing(str(i)) for i in range(20)])
        worker = fairq.Worker(one, concurrency=4, handle_signals=False, grace=5.0)
        started = asyncio.Event()
        release = asyncio.Event()

        @worker.queue("backlog", concurrency=2)
        async def slow(msg: fairq.Received) -> None:
            started.set()
            await release.wait()

        running = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(started.wait(), 10)
            await asyncio.sleep(0.3)  # whatever the worker's consumer was sent has arrived
            other = two.queue("backlog")
            got: list[fairq.Received] = []
            for _ in range(10):
                got += await other.receive(max_messages=20, wait=0.2)
                if len(got) >= 18:
                    break
            assert len(got) == 18, f"the worker held {20 - len(got)} of 20 with 2 slots"
            for m in got:
                await m.ack()
        finally:
            release.set()
            worker.stop()
            await asyncio.wait_for(running, 20)
        await two.queue("backlog").stats()  # each process writes its own counts
        s = await q.stats()
        assert (s.acked, s.redelivered) == (20, 0)


async def test_a_busy_worker_never_holds_more_than_its_slots(url: str) -> None:
    """A basic.get is outside the prefetch count, so each receive that asked with one let
    RabbitMQ push one more to the consumer (11 deliveries held for 8 slots in the review):
    a worker's receive takes only what was pushed."""
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("steady")
        await q.send_batch([fairq.Outgoing(str(i)) for i in range(60)])
        worker = fairq.Worker(broker, concurrency=3, handle_signals=False, grace=5.0)
        done: list[str] = []

        @worker.queue("steady", concurrency=3)
        async def handle(msg: fairq.Received) -> None:
            await asyncio.sleep(0.02)
            done.append(msg.id)

        running = asyncio.create_task(worker.run())
        most = 0
        try:
            for _ in range(1000):
                feed = broker.backend._feeds.get("steady")  # type: ignore[attr-defined]
                if feed is not None:
                    most = max(most, len(feed.unsettled))
                if len(done) == 60:
                    break
                await asyncio.sleep(0.005)
        finally:
            worker.stop()
            await asyncio.wait_for(running, 20)
        assert len(done) == 60
        assert most <= 3, f"the consumer held {most} deliveries for 3 slots"
