"""SPEC §6 (worker runtime, queues) on every backend, with the real clock and short leases."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

import fairq
import held
from races import extensions_after_acks


async def run_until(
    worker: fairq.Worker, done: Callable[[], Awaitable[bool]], limit: float = 10
) -> None:
    """Run ``worker`` until ``done()`` is true, then stop it and wait for its shutdown."""
    task = asyncio.create_task(worker.run())
    try:
        deadline = time.monotonic() + limit
        while not await done():
            assert time.monotonic() < deadline, "the worker did not finish in time"
            assert not task.done(), (
                f"the worker stopped early: {task.exception() if task.done() else ''}"
            )
            await asyncio.sleep(0.02)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)


@pytest.fixture
async def q(live_broker: fairq.Broker) -> AsyncIterator[fairq.Queue]:
    yield await live_broker.declare_queue("jobs", visibility_timeout=5, max_attempts=3)


def drained(q: fairq.Queue, acked: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        s = await q.stats()
        return s.acked >= acked and s.in_flight == 0

    return check


async def test_return_acks(live_broker: fairq.Broker, q: fairq.Queue) -> None:
    await q.send_batch([fairq.Outgoing(str(i)) for i in range(20)])
    seen: list[bytes] = []
    worker = fairq.Worker(live_broker, concurrency=4, handle_signals=False, poll_wait=0.2)

    @worker.queue("jobs")
    async def handle(msg: fairq.Received) -> None:
        seen.append(msg.body)

    await run_until(worker, drained(q, 20))
    assert sorted(seen, key=int) == [str(i).encode() for i in range(20)]
    assert worker.stats.acked == 20
    s = await q.stats()
    assert (s.visible, s.in_flight, s.acked) == (0, 0, 20)


async def test_exception_nacks_with_backoff_then_dead_letters(
    live_broker: fairq.Broker, q: fairq.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("ERROR", logger="fairq")
    await q.send(b"boom")
    attempts: list[tuple[int, float]] = []
    worker = fairq.Worker(live_broker, handle_signals=False, poll_wait=0.2)

    @worker.queue("jobs", retry=fairq.Backoff(base=0.2, cap=1.0, jitter=0.0))
    async def handle(msg: fairq.Received) -> None:
        attempts.append((msg.attempt, time.monotonic()))
        raise RuntimeError("inventory down")

    async def dead() -> bool:
        return (await q.stats()).dead_lettered == 1

    await run_until(worker, dead)
    assert [a for a, _ in attempts] == [1, 2, 3]
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(attempts)]
    assert gaps[0] >= 0.18 and gaps[1] >= 0.38, f"exponential backoff between attempts: {gaps}"
    (m,) = await live_broker.queue("jobs.dlq").receive()
    assert m.attributes["fairq.reason"] == "max_attempts"
    assert (await live_broker.queue("jobs.dlq").stats()).sent == 1  # counted where it went
    assert worker.stats.failed == 3
    logged = [r.getMessage() for r in caplog.records if "failed on message" in r.getMessage()]
    assert len(logged) == 3, logged  # the log says what happens next: two retries, then none
    assert "(attempt 1); retry in" in logged[0] and "(attempt 2); retry in" in logged[1]
    assert "attempt 3, the last of max_attempts=3" in logged[2] and "retry in" not in logged[2]


async def test_stats_count_only_acks_that_happened(
    live_broker: fairq.Broker, q: fairq.Queue
) -> None:
    """A handler that settles its message itself leaves the worker's own ack nothing to
    ack: the worker counts a lost lease, not an ack."""
    await q.send_batch([fairq.Outgoing(str(i)) for i in range(4)])
    worker = fairq.Worker(live_broker, concurrency=4, handle_signals=False, poll_wait=0.2)

    @worker.queue("jobs")
    async def handle(msg: fairq.Received) -> None:
        if msg.body == b"0":
            await msg.ack()

    await run_until(worker, drained(q, 4))
    assert (await q.stats()).acked == 4
    assert (worker.stats.acked, worker.stats.lease_lost) == (3, 1)
    assert worker.stats.per_queue == {"jobs": 3}


async def test_reject_dead_letters_at_once(live_broker: fairq.Broker, q: fairq.Queue) -> None:
    await q.send(b"poison")
    calls = 0
    worker = fairq.Worker(live_broker, handle_signals=False, poll_wait=0.2)

    @worker.queue("jobs")
    async def handle(msg: fairq.Received) -> None:
        nonlocal calls
        calls += 1
        raise fairq.Reject("cannot parse")

    async def dead() -> bool:
        return (await q.stats()).dead_lettered == 1

    await run_until(worker, dead)
    assert calls == 1
    (m,) = await live_broker.queue("jobs.dlq").receive()
    assert (m.attributes["fairq.reason"], m.attributes["fairq.detail"]) == (
        "rejected",
        "cannot parse",
    )


async def test_a_failure_on_the_last_attempt_dead_letters_with_the_error(
    live_broker: fairq.Broker,
) -> None:
    """The handler's exception of the last attempt is the dead letter's ``fairq.detail``
    (``Type: text``), so a look at the DLQ says why each message is there."""
    q = await live_broker.declare_queue("failing", max_attempts=2)
    await q.send(b"order-9")
    worker = fairq.Worker(live_broker, handle_signals=False, poll_wait=0.2)

    @worker.queue("failing", retry=fairq.Backoff(base=0.01, cap=0.01, jitter=0.0))
    async def handle(msg: fairq.Received) -> None:
        raise ValueError(f"total missing (attempt {msg.attempt})")

    async def dead() -> bool:
        return (await q.stats()).dead_lettered == 1

    await run_until(worker, dead)
    (m,) = await live_broker.queue("failing.dlq").receive()
    assert (m.attributes["fairq.reason"], m.attributes["fairq.detail"]) == (
        "max_attempts",
        "ValueError: total missing (attempt 2)",
    )


async def test_sync_handlers_run_in_threads(live_broker: fairq.Broker, q: fairq.Queue) -> None:
    await q.send_batch([fairq.Outgoing(str(i)) for i in range(8)])
    threads: set[str] = set()
    worker = fairq.Worker(live_broker, concurrency=4, handle_signals=False, poll_wait=0.2)

    @worker.queue("jobs", concurrency=4)
    def handle(msg: fairq.Received) -> None:
        threads.add(threading.current_thread().name)
        time.sleep(0.05)  # blocking is fine here: it is not the event loop's thread

    await run_until(worker, drained(q, 8))
    assert threads and threading.main_thread().name not in threads


async def test_concurrency_limits(live_broker: fairq.Broker) -> None:
    a = await live_broker.declare_queue("a")
    b = await live_broker.declare_queue("b")
    for queue in (a, b):
        await queue.send_batch([fairq.Outgoing(b"x") for _ in range(30)])
    running = {"a": 0, "b": 0}
    peak = {"a": 0, "b": 0, "all": 0}
    worker = fairq.Worker(live_broker, concurrency=5, handle_signals=False, poll_wait=0.2)

    def make(name: str) -> Callable[[fairq.Received], Awaitable[None]]:
        async def handle(msg: fairq.Received) -> None:
            running[name] += 1
            peak[name] = max(peak[name], running[name])
            peak["all"] = max(peak["all"], running["a"] + running["b"])
            await asyncio.sleep(0.01)
            running[name] -= 1

        return handle

    worker.queue("a", concurrency=3)(make("a"))
    worker.queue("b", concurrency=4)(make("b"))

    async def both() -> bool:
        return (await a.stats()).acked == 30 and (await b.stats()).acked == 30

    await run_until(worker, both)
    assert peak["a"] <= 3 and peak["b"] <= 4 and peak["all"] <= 5
    assert peak["all"] == 5, "the worker should use all its slots"


async def test_leases_are_extended_while_a_handler_runs(live_broker: fairq.Broker) -> None:
    # a lease of 1 s (the keeper extends it at half its length: a loaded machine's round
    # trips stay well inside the other half)
    q = await live_broker.declare_queue("slow", visibility_timeout=1.0)
    await q.send(b"x")
    attempts: list[int] = []
    worker = fairq.Worker(live_broker, handle_signals=False, poll_wait=0.1)

    @worker.queue("slow")
    async def handle(msg: fairq.Received) -> None:
        attempts.append(msg.attempt)
        await asyncio.sleep(3.5)  # three and a half leases long

    await run_until(worker, drained(q, 1))
    assert attempts == [1], "the message must not be delivered again while it runs"
    assert worker.stats.lease_lost == 0


async def test_stop_lets_running_handlers_finish(live_broker: fairq.Broker, q: fairq.Queue) -> None:
    await q.send(b"x")
    started = asyncio.Event()
    finished = []
    worker = fairq.Worker(live_broker, handle_signals=False, poll_wait=0.1, grace=5)

    @worker.queue("jobs")
    async def handle(msg: fairq.Received) -> None:
        started.set()
        await asyncio.sleep(0.3)
        finished.append(msg.id)

    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 5)
    worker.stop()
    await asyncio.wait_for(task, 5)
    assert len(finished) == 1
    s = await q.stats()
    assert (s.acked, s.in_flight, s.visible) == (1, 0, 0)


async def test_stop_gives_back_what_does_not_finish_in_grace(
    live_broker: fairq.Broker, q: fairq.Queue
) -> None:
    await q.send_batch([fairq.Outgoing(b"x") for _ in range(3)])
    started = asyncio.Event()
    worker = fairq.Worker(
        live_broker, concurrency=3, handle_signals=False, poll_wait=0.1, grace=0.2
    )

    @worker.queue("jobs")
    async def handle(msg: fairq.Received) -> None:
        started.set()
        await asyncio.sleep(60)

    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.sleep(0.1)
    worker.stop()
    await asyncio.wait_for(task, 5)
    assert worker.stats.released == 3
    back = await q.receive(max_messages=10)
    assert len(back) == 3
    assert {m.attempt for m in back} == {1}, "a released delivery does not count as an attempt"


async def test_worker_needs_a_handler_and_a_declared_queue(live_broker: fairq.Broker) -> None:
    with pytest.raises(fairq.InvalidOption):
        await fairq.Worker(live_broker, handle_signals=False).run()
    worker = fairq.Worker(live_broker, handle_signals=False)

    @worker.queue("never-declared")
    async def handle(msg: fairq.Received) -> None:
        pass

    with pytest.raises(fairq.QueueNotFound):
        await worker.run()
    with pytest.raises(fairq.InvalidOption):
        worker.queue("never-declared")(handle)  # one handler per queue


@pytest.mark.requires("persistence")
async def test_worker_connects_from_a_url(url: str) -> None:
    async with await fairq.connect(url) as b:
        q = await b.declare_queue("jobs")
        await q.send(b"x")
    worker = fairq.Worker(url, handle_signals=False, poll_wait=0.1)
    done = asyncio.Event()

    @worker.queue("jobs")
    async def handle(msg: fairq.Received) -> None:
        done.set()

    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(done.wait(), 5)
    worker.stop()
    await asyncio.wait_for(task, 5)
    async with await fairq.connect(url) as b:
        assert (await b.queue("jobs").stats()).acked == 1


def test_backoff_delays() -> None:
    b = fairq.Backoff(base=1, cap=300)
    rng = random.Random(7)
    for attempt, top in [(1, 1), (2, 2), (3, 4), (5, 16), (9, 256), (10, 300), (100, 300)]:
        delays = [b.delay(attempt, rng) for _ in range(200)]
        assert all(top / 2 <= d <= top for d in delays), (attempt, min(delays), max(delays))
        assert len(set(delays)) > 100, "jitter spreads the retries"
    assert fairq.Backoff(base=2, cap=10, jitter=0).delay(2) == 4
    for bad in ({"jitter": 2}, {"base": float("nan")}, {"cap": float("inf")}, {"base": -1}):
        with pytest.raises(fairq.InvalidOption):
            fairq.Backoff(**bad)


@pytest.mark.parametrize(
    "options", [{"poll_wait": 0}, {"poll_wait": -1}, {"poll_wait": float("nan")}, {"grace": -1}]
)
def test_a_worker_refuses_waits_it_could_spin_on(options: dict[str, float]) -> None:
    # poll_wait 0 with an attention handler once spun the loop without yielding
    with pytest.raises(fairq.InvalidOption):
        fairq.Worker("memory://", **options)  # type: ignore[arg-type]


async def test_idle_queues_do_not_hold_slots(live_broker: fairq.Broker) -> None:
    """A worker over many queues with few slots serves a busy queue at once, even while its
    other queues sit empty in a long poll."""
    names = [f"q{i}" for i in range(6)]
    for name in names:
        await live_broker.declare_queue(name)
    got = asyncio.Event()
    worker = fairq.Worker(live_broker, concurrency=2, handle_signals=False, poll_wait=5.0)
    for name in names:

        @worker.queue(name, concurrency=2)
        async def handle(msg: fairq.Received) -> None:
            got.set()

    task = asyncio.create_task(worker.run())
    await asyncio.sleep(0.3)  # every consumer is waiting now
    started = time.monotonic()
    await live_broker.queue(names[-1]).send(b"x")
    await asyncio.wait_for(got.wait(), 4)
    took = time.monotonic() - started
    worker.stop()
    await asyncio.wait_for(task, 10)
    assert took < 1.0, f"the last queue waited {took:.2f} s for a slot"


async def test_an_ack_racing_a_lease_extension_is_no_lost_lease(
    live_broker: fairq.Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler past half its lease is extended; its ack lands while the extension is on
    its way: that is no lost lease (no warning, not counted)."""
    q = await live_broker.declare_queue("race", visibility_timeout=0.4)
    await q.send_batch([fairq.Outgoing(str(i)) for i in range(3)])
    worker = fairq.Worker(live_broker, concurrency=1, handle_signals=False, poll_wait=0.1)

    @worker.queue("race", concurrency=1)
    async def handle(msg: fairq.Received) -> None:
        await asyncio.sleep(0.3)  # past half the lease: the keeper extends it

    caplog.set_level("WARNING", logger="fairq")
    with extensions_after_acks(live_broker) as raced:
        await run_until(worker, drained(q, 3))
    assert raced, "the race happened: an extension answered after the ack"
    assert worker.stats.lease_lost == 0
    assert "lost" not in caplog.text, caplog.text


async def test_memory_stays_flat_while_a_worker_is_busy(
    live_broker: fairq.Broker, q: fairq.Queue
) -> None:
    """What a worker has acked is let go while it keeps working: the process does not grow
    with the messages it has handled (kept small: tracemalloc slows the whole process, and
    the real-clock fairness tests may run beside it). (A backend that kept acked messages, bodies
    included, until their leases would have ended grew by every body while its worker
    never ran out of work.)"""
    worker = fairq.Worker(live_broker, concurrency=50, handle_signals=False, poll_wait=0.2)

    async def feed() -> int:
        await q.send_batch([fairq.Outgoing(os.urandom(held.BODY)) for _ in range(250)])
        return 250

    # 1,800 messages (3.6 MB of bodies) handled between the two readings
    await held.assert_flat_while_busy(worker, worker.queue("jobs"), feed, 2500, 300, 2100)


async def test_an_exception_text_any_engine_cannot_store_is_escaped(
    live_broker: fairq.Broker,
) -> None:
    """A handler's exception may say anything (NUL, 1,000+ characters of €): the nack still
    goes out, with the text escaped and cut, and the dead letter keeps it (it used to be
    refused, so the nack was skipped and the message waited out its lease, and Redis cut
    UTF-8 mid-character, leaving a DLQ nothing could read). Lone surrogates: tests/unit/
    test_details.py (a log holding one cannot cross pytest-xdist's channel)."""
    q = await live_broker.declare_queue("odd-errors", max_attempts=1, visibility_timeout=30)
    texts = ["nul \x00 here", "€" * 1200]
    await q.send_batch([fairq.Outgoing(str(i)) for i in range(len(texts))])
    worker = fairq.Worker(live_broker, handle_signals=False, poll_wait=0.2)

    @worker.queue("odd-errors")
    async def handle(msg: fairq.Received) -> None:
        raise ValueError(texts[int(msg.body)])

    async def dead() -> bool:  # well before the 30 s leases would end
        return (await q.stats()).dead_lettered == len(texts)

    await run_until(worker, dead)
    got = await live_broker.queue("odd-errors.dlq").receive(max_messages=10)
    details = {m.body: m.attributes["fairq.detail"] for m in got}
    assert details[b"0"] == "ValueError: nul \\x00 here"
    assert details[b"1"] == ("ValueError: " + "€" * 1200)[:1000]
