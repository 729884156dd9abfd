"""The worker's handler runners (``worker/runners.py``): messages run in a few long-lived
tasks instead of a task each, yet every message still behaves as if it had its own task —
its own context, ``current_task()``, timeouts and cancellation — and slow handlers still run
side by side up to the concurrency."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

import fairq
from fairq.worker.runners import Runners

_seen: contextvars.ContextVar[str | None] = contextvars.ContextVar("seen", default=None)


async def _run_until(worker: fairq.Worker, done: asyncio.Event, timeout: float = 30) -> None:
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(done.wait(), timeout)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


async def test_each_message_runs_in_its_own_context(tmp_path: Path) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'f.db'}") as broker:
        q = await broker.declare_queue("work")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(50)])
        worker = fairq.Worker(broker, concurrency=4, handle_signals=False, poll_wait=0.2)
        leaked: list[str] = []
        done = asyncio.Event()
        handled = 0

        @worker.queue("work", concurrency=4)
        async def handle(msg: fairq.Received) -> None:
            nonlocal handled
            before = _seen.get()
            if before is not None:
                leaked.append(before)
            _seen.set(msg.id)
            if handled % 3 == 0:
                await asyncio.sleep(0)  # some wait: the rest go on in other runners
            assert _seen.get() == msg.id
            handled += 1
            if handled == 50:
                done.set()

        await _run_until(worker, done)
        assert leaked == [], "a handler saw another message's context variable"
        assert worker.stats.acked == 50


async def test_slow_handlers_run_side_by_side_each_in_a_task_of_its_own(tmp_path: Path) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'f.db'}") as broker:
        q = await broker.declare_queue("work")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(8)])
        worker = fairq.Worker(broker, concurrency=8, handle_signals=False, poll_wait=0.2)
        running = 0
        most = 0
        tasks: set[asyncio.Task[object] | None] = set()
        all_in = asyncio.Event()
        done = asyncio.Event()
        handled = 0

        @worker.queue("work", concurrency=8)
        async def handle(msg: fairq.Received) -> None:
            nonlocal running, most, handled
            running += 1
            most = max(most, running)
            tasks.add(asyncio.current_task())
            if running == 8:
                all_in.set()
            await asyncio.wait_for(all_in.wait(), 10)  # every handler waits for all eight
            running -= 1
            handled += 1
            if handled == 8:
                done.set()

        await _run_until(worker, done)
        assert most == 8
        assert len(tasks) == 8 and None not in tasks


async def test_timeouts_and_stray_cancellations_stay_inside_the_handler(tmp_path: Path) -> None:
    """``asyncio.timeout`` in a handler cancels that handler only (its task is its own), and
    a CancelledError a handler lets out without being cancelled does not stop the worker:
    it is the handler's failure, settled at once (here its last attempt: dead-lettered),
    not left to wait for the end of its lease."""
    async with await fairq.connect(f"sqlite:///{tmp_path / 'f.db'}") as broker:
        q = await broker.declare_queue("work", max_attempts=1, visibility_timeout=300)
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(6)])
        worker = fairq.Worker(broker, concurrency=2, handle_signals=False, poll_wait=0.2)
        timed_out = 0
        finished = 0
        done = asyncio.Event()

        @worker.queue("work", concurrency=2)
        async def handle(msg: fairq.Received) -> None:
            nonlocal timed_out, finished
            try:
                if msg.body == b"m1":
                    try:
                        async with asyncio.timeout(0.01):
                            await asyncio.sleep(5)
                    except TimeoutError:
                        timed_out += 1
                elif msg.body == b"m3":
                    cancelled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    cancelled.cancel()
                    await cancelled  # raises CancelledError into the handler
            finally:
                finished += 1
                if finished == 6:
                    done.set()

        await _run_until(worker, done)
        assert timed_out == 1
        assert worker.stats.acked == 5  # m3 let a CancelledError out: not acked
        assert worker.stats.failed == 1
        assert (await q.stats()).in_flight == 0
        dead = await broker.queue("work.dlq").receive(max_messages=10, wait=2)
        assert [m.body for m in dead] == [b"m3"]


async def test_stop_gives_back_what_no_runner_started(tmp_path: Path) -> None:
    """Messages received but not started when the worker stops go back at once, without
    an attempt; the running one finishes."""
    async with await fairq.connect(f"sqlite:///{tmp_path / 'f.db'}") as broker:
        q = await broker.declare_queue("work")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(4)])
        worker = fairq.Worker(broker, concurrency=4, handle_signals=False, poll_wait=0.2)
        release = asyncio.Event()
        bodies: list[bytes] = []

        @worker.queue("work", concurrency=4)
        async def handle(msg: fairq.Received) -> None:
            bodies.append(msg.body)
            worker.stop()  # while the other three wait for a runner
            await release.wait()

        task = asyncio.create_task(worker.run())
        await asyncio.sleep(0.1)
        release.set()
        await asyncio.wait_for(task, 30)
        assert bodies == [b"m0"]
        assert (worker.stats.acked, worker.stats.released) == (1, 3)
        s = await q.stats()
        assert (s.in_flight, s.visible, s.acked) == (0, 3, 1)
        again = await q.receive(max_messages=3)
        assert [m.attempt for m in again] == [1, 1, 1]  # given back without an attempt


async def test_the_lease_keeper_extends_what_waits_for_a_runner() -> None:
    """A message gets its lease-keeping record (``_running``) only once its handler waits;
    one still waiting for a runner when its lease is half gone (handlers that hold the event
    loop can keep the runners from it that long) is found in the runners' backlog and
    extended too, and taken out of ``_running`` again when its handler returns. The
    metrics count it running all the while, once."""
    clock = fairq.ManualClock()
    async with await fairq.connect("memory://", clock=clock) as broker:
        q = await broker.declare_queue("work", visibility_timeout=10.0)
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(3)])
        worker = fairq.Worker(broker, concurrency=3, handle_signals=False)
        bodies: list[bytes] = []
        all_run = asyncio.Event()

        @worker.queue("work", concurrency=3)
        async def handle(msg: fairq.Received) -> None:
            bodies.append(msg.body)
            if len(bodies) == 3:
                all_run.set()

        # a worker that received three messages no runner has started yet
        c = worker._consumers["work"]
        await worker._attach(c)
        stopping = worker._stopping = asyncio.Event()
        stopping.set()  # (runners start only once it is clear)
        c.runners = runners = worker._runners(c)
        msgs = await q.receive(max_messages=3)
        c.busy = 3
        runners.add(worker._queued(c, msgs))
        loop = asyncio.get_running_loop()
        await worker._extend_leases(loop.time() + 4.0)  # not due yet
        assert worker._running == {}
        assert worker._reading().running == {"work": 3}  # the metrics count them running
        clock.advance(6.0)
        await worker._extend_leases(loop.time() + 6.0)  # past half the lease
        assert set(worker._running) == {m.receipt for m in msgs}
        assert worker._reading().running == {"work": 3}  # (each counted once)
        clock.advance(6.0)  # past the end of the first lease: kept
        stopping.clear()
        runners.more()
        await asyncio.wait_for(all_run.wait(), 10)
        assert bodies == [b"m0", b"m1", b"m2"] and worker._running == {}
        await worker._settled()
        assert (worker.stats.acked, worker.stats.lease_lost) == (3, 0)
        s = await q.stats()
        assert (s.in_flight, s.visible, s.acked) == (0, 0, 3)
        stopping.set()
        runners.stop()
        await asyncio.gather(*runners.tasks)


async def test_a_failure_settling_without_a_wait_before_is_left_alone_by_the_keeper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A handler that raises without waiting has no lease-keeping record yet when its nack
    goes out: it gets one then, marked settled (the keeper extends it no more, so an
    extension racing the nack is no lost lease) and with its runner task (the shutdown
    waits for it), taken out again once the nack is done."""
    nacking = asyncio.Event()
    nacked = asyncio.Event()
    extended: list[str] = []
    nack = fairq.Received.nack
    extend_batch = fairq.Queue.extend_batch

    async def slow_nack(msg: fairq.Received, delay: float = 0.0, **kw: Any) -> None:
        nacking.set()
        await nacked.wait()
        await nack(msg, delay, **kw)

    async def counted(q: fairq.Queue, receipts: list[str], seconds: float) -> list[str]:
        extended.extend(receipts)
        return await extend_batch(q, receipts, seconds)

    monkeypatch.setattr(fairq.Received, "nack", slow_nack)
    monkeypatch.setattr(fairq.Queue, "extend_batch", counted)
    async with await fairq.connect("memory://") as broker:
        q = await broker.declare_queue("work", visibility_timeout=10.0)
        await q.send(b"x")
        worker = fairq.Worker(broker, concurrency=1, handle_signals=False, poll_wait=0.1)

        @worker.queue("work", concurrency=1)
        async def handle(msg: fairq.Received) -> None:
            raise RuntimeError("at once")

        task = asyncio.create_task(worker.run())
        await asyncio.wait_for(nacking.wait(), 10)
        [run] = worker._running.values()
        assert run.settled and run.task is not None and not run.task.done()
        await worker._extend_leases(asyncio.get_running_loop().time() + 100.0)
        assert extended == [] and not run.lost
        nacked.set()
        worker.stop()  # (the shutdown waits for the runner task)
        await asyncio.wait_for(task, 30)
        assert worker._running == {}
        assert (worker.stats.failed, worker.stats.lease_lost) == (1, 0)
        assert (await q.stats()).in_flight == 0


class _Awaitable:
    def __await__(self) -> Generator[Any, None, None]:
        yield from asyncio.sleep(0).__await__()


async def test_a_handler_marked_a_coroutine_function_may_return_any_awaitable() -> None:
    """A function marked a coroutine function (``inspect.markcoroutinefunction``, Python
    3.12) is awaited like any other: what it returns need not be a coroutine."""
    async with await fairq.connect("memory://") as broker:
        q = await broker.declare_queue("work")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(3)])
        worker = fairq.Worker(broker, concurrency=2, handle_signals=False, poll_wait=0.1)
        done = asyncio.Event()
        handled = 0

        def handle(msg: fairq.Received) -> _Awaitable:
            nonlocal handled
            handled += 1
            if handled == 3:
                done.set()
            return _Awaitable()

        mark = getattr(inspect, "markcoroutinefunction", None)
        worker.queue("work", concurrency=2)(handle if mark is None else mark(handle))
        worker._consumers["work"].is_async = True  # (what the mark makes it on 3.12)
        await _run_until(worker, done)
        assert (worker.stats.acked, worker.stats.failed) == (3, 0)


async def test_a_runner_goes_on_after_an_item_that_raises() -> None:
    """``handle`` settles every outcome itself, but an item that raises anyway (at once, or
    after a wait) is logged and the runner goes on with the rest of the backlog, each item
    still in a fresh context."""
    stopping = asyncio.Event()
    ran: list[tuple[int, str | None]] = []
    done = asyncio.Event()

    async def handle(item: int, task: asyncio.Task[None]) -> None:
        ran.append((item, _seen.get()))
        _seen.set(f"item {item}")
        if item in (3, 4):
            await asyncio.sleep(0)
        if item in (1, 3):
            raise RuntimeError(f"item {item}")
        if item == 4:
            raise asyncio.CancelledError  # not the runner's cancellation
        if item == 7:
            done.set()

    runners: Runners[int] = Runners("work", 1, handle, stopping)
    runners.add(list(range(8)))
    await asyncio.wait_for(done.wait(), 10)
    assert ran == [(i, None) for i in range(8)]
    assert len(runners.tasks) == 1  # one runner did it all
    stopping.set()
    runners.stop()
    await asyncio.wait_for(asyncio.gather(*runners.tasks), 10)
