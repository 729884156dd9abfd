"""The worker's coalesced acks (``worker/runtime.py``): the messages handled in one pass of
the event loop are acked in one ``ack_batch``, which the next receive joins in one SQLite
transaction (the consumer whose slots they freed sends them with its receive, one
``ack_receive``); a lost lease is still counted per message, acks left for a consumer that
gets no slot still go, and acks queued when the worker stops are sent before it returns."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

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


async def test_the_consumer_sends_its_batch_acks_with_its_receive(tmp_path: Path) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'acks.db'}") as broker:
        q = await broker.declare_queue("work")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(320)])
        backend = broker.backend
        calls = {"ack": 0, "ack_receive": 0}
        ack, ack_receive = backend.ack, backend.ack_receive

        def counted(name: str, fn: Any) -> Any:
            def call(*args: Any) -> Any:
                calls[name] += 1
                return fn(*args)

            return call

        backend.ack = counted("ack", ack)  # type: ignore[method-assign]
        backend.ack_receive = counted("ack_receive", ack_receive)  # type: ignore[method-assign]
        worker = await _drain(broker, 320, 16)
        assert worker.stats.acked == 320 and worker.stats.lease_lost == 0
        assert (await q.stats()).depth == 0
        # 20 batches of 16: each batch's acks go with the next receive; an ack of its own
        # only for what is left when the queue runs dry or the worker stops
        assert calls["ack_receive"] >= 18, calls
        assert calls["ack"] <= 2, calls


async def test_a_lost_lease_in_acks_sent_with_a_receive_is_counted(tmp_path: Path) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'acks.db'}") as broker:
        q = await broker.declare_queue("work", visibility_timeout=30)
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(64)])
        backend = broker.backend
        ack_receive = backend.ack_receive

        async def one_lease_gone(
            queue: str, receipts: list[str], n: int, vt: float | None
        ) -> tuple[list[str], list[fairq.Received]]:
            await backend.release(queue, receipts[:1])  # its lease ends before the ack
            return await ack_receive(queue, receipts, n, vt)

        backend.ack_receive = one_lease_gone  # type: ignore[method-assign]
        worker = await _drain(broker, 64, 8)
        # one receipt of each batch sent with a receive named a lease that was gone:
        # counted per message as lost, not as acked, as an ack of its own reports it
        assert worker.stats.lease_lost >= 1
        assert worker.stats.ack_failed == worker.stats.lease_lost
        assert (await q.stats()).acked == worker.stats.acked


async def test_acks_left_for_a_consumer_that_gets_no_slot_still_go(tmp_path: Path) -> None:
    """Two queues share three slots: the slots a's handlers free may go to b's consumer; the
    acks a's consumer was to send with its receive still go, by a task of their own, while
    one of a's handlers holds a slot until b is drained."""
    async with await fairq.connect(f"sqlite:///{tmp_path / 'two.db'}") as broker:
        a, b = await broker.declare_queue("a"), await broker.declare_queue("b")
        await a.send_batch([fairq.Outgoing(f"a{i}") for i in range(100)])
        await b.send_batch([fairq.Outgoing(f"b{i}") for i in range(100)])
        worker = fairq.Worker(broker, concurrency=3, handle_signals=False, poll_wait=0.2)
        release = asyncio.Event()
        handled = 0
        all_but_one = asyncio.Event()

        async def handle(msg: fairq.Received) -> None:
            nonlocal handled
            if msg.body == b"a0":
                await release.wait()
            handled += 1
            if handled == 199:
                all_but_one.set()

        worker.queue("a", concurrency=3)(handle)
        worker.queue("b", concurrency=3)(handle)
        task = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(all_but_one.wait(), 30)
            for _ in range(300):  # every ack but a0's is stored while a0 still runs
                if (await a.stats()).acked + (await b.stats()).acked == 199:
                    break
                await asyncio.sleep(0.01)
            assert ((await a.stats()).acked, (await b.stats()).acked) == (99, 100)
        finally:
            release.set()
            worker.stop()
            await asyncio.wait_for(task, 30)
        assert worker.stats.acked == 200 and (await a.stats()).depth == 0
