"""The worker's coalesced acks (``worker/runtime.py``): the messages handled in one pass of
the event loop are acked in one ``ack_batch``, which the next receive joins in one SQLite
transaction; a lost lease is still counted per message, and acks queued when the worker
stops are sent before it returns."""

from __future__ import annotations

import asyncio
from pathlib import Path

import fairq


async def _drain(broker: fairq.Broker, n: int, concurrency: int) -> fairq.Worker:
    worker = fairq.Worker(broker, concurrency=concurrency, handle_signals=False, poll_wait=0.2)
    done = asyncio.Event()
    seen = 0

    @worker.queue("work", concurrency=concurrency)
    async def handle(msg: fairq.Received) -> None:
        nonlocal seen
        seen += 1
        if seen == n:
            done.set()

    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(done.wait(), 30)
    worker.stop()  # the last acks are still queued: stop sends them
    await asyncio.wait_for(task, 30)
    return worker


async def test_a_drain_commits_about_once_per_batch(tmp_path: Path) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'acks.db'}") as broker:
        q = await broker.declare_queue("work")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(320)])
        writer = broker.backend._writer  # type: ignore[attr-defined]
        before = writer.commits
        worker = await _drain(broker, 320, 16)
        commits = writer.commits - before
        assert worker.stats.acked == 320 and worker.stats.lease_lost == 0
        assert (await q.stats()).depth == 0, "every ack was stored, the last ones at stop"
        # 20 batches of 16: a receive and the previous batch's acks share a commit (one
        # ack per message, or an ack transaction per batch, would be 320 or 40)
        assert commits <= 30, commits


async def test_a_lost_lease_is_counted_per_message(tmp_path: Path) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'lost.db'}") as broker:
        q = await broker.declare_queue("work")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(6)])
        worker = fairq.Worker(broker, concurrency=4, handle_signals=False, poll_wait=0.2)
        handled = 0
        done = asyncio.Event()

        @worker.queue("work", concurrency=4)
        async def handle(msg: fairq.Received) -> None:
            nonlocal handled
            handled += 1
            if msg.body in (b"m1", b"m4"):
                await msg.ack()  # the worker's own ack then finds no lease
            if handled == 6:
                done.set()

        task = asyncio.create_task(worker.run())
        await asyncio.wait_for(done.wait(), 30)
        worker.stop()
        await task
        assert (await q.stats()).depth == 0
        assert worker.stats.lease_lost == 2
        assert worker.stats.acked == 4  # the acks that happened: m1 and m4 were acked by hand
