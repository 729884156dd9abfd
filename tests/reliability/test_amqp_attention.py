"""Attention domains on RabbitMQ under crashes (issue 13, SPEC §5 rules 1 and 7): the work
in RabbitMQ, its tickets and signals in the store (``backends/amqp/attention.py``).

* a publisher killed between its two steps (tickets and signal written, messages not yet
  published) strands nothing: its tickets find no message and are dropped, every message
  that was published is handled once;
* a message that reaches a work queue without a ticket (another AMQP client, a crash
  between a redrive's publish and its tickets) is found by the reconciler through the
  management API, without a look at the other keys' queues;
* an attention worker killed mid-slice leaves few tickets leased, and a new worker handles
  every message: none lost;
* a running attention worker whose connection drops mid-slice carries on, and every
  message is handled (those whose acks went down with the connection come back).
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_amqp import _close_my_connection
from test_crash import read_line, spawn

import fairq
from fairq.worker.slices import _PREFETCH, _SLICE_BATCH
from services import backend_url, drop_namespace, rabbit_vhost

pytestmark = pytest.mark.slow


@pytest.fixture(params=["redis", "sqlite"])
def amqp_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A vhost of this test's own on the shared broker; the store on Redis or SQLite."""
    with rabbit_vhost() as vhost:
        store = backend_url(request.param, tmp_path, vhost)
        name = f"fairq-test-{uuid.uuid4().hex[:8]}"
        yield f"amqp://guest:guest@127.0.0.1:5672/{vhost}?store={store}&name={name}"
        drop_namespace(store)


async def run_worker(
    broker: fairq.Broker, domain: str, until: object, timeout: float = 30.0
) -> Counter[bytes]:
    """Run a Worker on ``domain`` until ``until()`` (an async predicate) holds."""
    handled: Counter[bytes] = Counter()
    worker = fairq.Worker(broker, concurrency=4, handle_signals=False, poll_wait=0.2)

    @worker.attention(domain, reconcile_interval=3600)
    async def handle(msg: fairq.Received) -> None:
        handled[msg.body] += 1

    task = asyncio.create_task(worker.run())
    deadline = time.monotonic() + timeout
    try:
        while not await until(handled):  # type: ignore[operator]
            assert time.monotonic() < deadline, f"not done in {timeout} s: {handled}"
            await asyncio.sleep(0.1)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 15)
    return handled


async def test_a_publisher_killed_between_its_two_steps_strands_nothing(amqp_url: str) -> None:
    async with await fairq.connect(amqp_url) as broker:
        await broker.declare_attention("market")
    child = spawn("attention-die", amqp_url, 5)
    read_line(child, "dying")
    assert child.wait(20) == -signal.SIGKILL
    async with await fairq.connect(amqp_url) as broker:
        a = broker.attention("market")
        keys = {k.key: k for k in await a.key_stats()}
        assert keys["store-0"].backlog == 4, "the dead publish's tickets are in the store"
        assert keys["store-0"].pending == 1
        assert (await (await a.queue("store-0")).stats()).visible == 1, "its messages are not"

        async def settled(handled: Counter[bytes]) -> bool:
            s = await a.stats()
            backlog = sum(k.backlog for k in await a.key_stats())
            return sum(handled.values()) == 5 and (s.signals_pending, s.slices, backlog) == (
                0,
                0,
                0,
            )

        handled = await run_worker(broker, "market", settled)
        assert handled == {b"ok": 5}, "every published message once; nothing else"
        assert await a.reconcile() == 0


async def test_a_message_without_a_ticket_is_found_by_the_reconciler(amqp_url: str) -> None:
    async with await fairq.connect(amqp_url) as broker:
        a = await broker.declare_attention("market")
        for k in range(20):
            await a.publish(f"store-{k}", b"ok")
        for _ in range(20):  # drain them: every key known, every queue empty
            s = await a._take(0)
            assert s is not None
            msgs, _ = await a._receive(s, 10, None)
            for m in msgs:
                await m.ack()
            await a._end(s, len(msgs), None)
        # a message published to store-7's work queue past fairq: no ticket, no signal
        queue = (await a.queue("store-7")).name
        backend = broker.backend
        (took,) = await backend._publish(  # type: ignore[attr-defined]
            [("", queue, b"orphan", {}, 0, f"orphan-{uuid.uuid4().hex}")], "a test's publish"
        )
        assert took
        assert await a._take(0) is None
        calls: Counter[str] = Counter()
        ready_queues = backend._management.ready_queues  # type: ignore[attr-defined]

        async def counted(vhost: str, regex: str) -> list[str]:
            calls["list"] += 1
            return await ready_queues(vhost, regex)  # type: ignore[no-any-return]

        backend._management.ready_queues = counted  # type: ignore[attr-defined]
        found = 0
        deadline = time.monotonic() + 30
        while not found:  # the management API samples queue counts every few seconds
            assert time.monotonic() < deadline, "the reconciler never found the message"
            found = await a.reconcile()
            if not found:
                await asyncio.sleep(0.5)
        assert found == 1
        assert calls["list"] >= 1, "one listing per reconcile, not a look at every key"
        s = await a._take(0)
        assert s is not None and s.key == "store-7"
        (m,), _ = await a._receive(s, 10, None)
        assert m.body == b"orphan"
        await m.ack()
        await a._end(s, 1, None)
        st = await a.stats()
        assert (st.reconciled, st.signals_pending) == (1, 0)


async def test_a_killed_attention_worker_loses_nothing(amqp_url: str) -> None:
    keys, per_key = 10, 200
    async with await fairq.connect(amqp_url) as broker:
        a = await broker.declare_attention(
            "market",
            plans={"basic": fairq.Plan(1, 50, 20.0)},
            queue_options={"visibility_timeout": 5.0},  # the dead worker's tickets come back
        )
        for k in range(keys):
            await a.publish_batch(
                f"store-{k}", [fairq.Outgoing(f"{k}-{i}") for i in range(per_key)]
            )

        async def leased() -> int:
            return sum(k.in_flight for k in await a.key_stats(top=keys))

        left = []
        for _ in range(2):
            before = await leased()
            child = spawn("attention-worker", amqp_url, 4)
            read_line(child, "handled 300", timeout=60)
            child.send_signal(signal.SIGKILL)  # mid-slice: 4 slices run
            child.wait()
            left.append(await leased() - before)
        # the dead worker's tickets stay leased until their lease ends; its messages are back
        # in RabbitMQ at once (its connection closed). What a kill leaves is bounded by what
        # its 4 slices can hold: each leases _PREFETCH of handling at a time (1 ms handlers:
        # a message or two), the next lease taken as the one before starts, plus up to twice
        # a lease of handled ones whose ticket acks are in flight — 8 a slice, 32 in all,
        # doubled for a loaded machine — never the 4 slices' whole plans (200), never the
        # backlog (2,000). ~20 under load.
        per_lease = max(1, int(_PREFETCH / 0.001))
        bound = 2 * 4 * (2 * per_lease + 2 * per_lease)
        assert bound < 200 and bound <= 4 * _SLICE_BATCH
        assert all(n <= bound for n in left), f"tickets left leased by each kill: {left}"

        queues = [await a.queue(f"store-{k}") for k in range(keys)]

        async def all_done(handled: Counter[bytes]) -> bool:
            tickets = sum(k.backlog + k.in_flight for k in await a.key_stats(top=keys))
            messages = sum([(await q.stats()).visible for q in queues])
            return tickets == 0 and messages == 0 and (await a.stats()).slices == 0

        handled = await run_worker(broker, "market", all_done, timeout=90)
        # what the killed workers had not acked came back, and nothing else: every message
        # was handled by them or by this worker, whose bodies run on from theirs in each key
        assert handled, "the new worker had work left to do"
        for k in range(keys):
            mine = sorted(int(b.split(b"-")[1]) for b in handled if b.startswith(b"%d-" % k))
            if mine:
                assert mine == list(range(mine[0], per_key)), f"store-{k}: a gap in {mine}"


async def test_an_attention_worker_survives_a_dropped_connection(amqp_url: str) -> None:
    keys, per_key = 4, 100
    async with await fairq.connect(amqp_url) as broker:
        a = await broker.declare_attention(
            "market",
            plans={"basic": fairq.Plan(1, 20, 20.0)},
            queue_options={"visibility_timeout": 3.0},
        )
        for k in range(keys):
            await a.publish_batch(f"s{k}", [fairq.Outgoing(f"{k}-{i}") for i in range(per_key)])
        handled: Counter[bytes] = Counter()
        dropped = asyncio.Event()
        worker = fairq.Worker(broker, concurrency=4, handle_signals=False, poll_wait=0.2)

        @worker.attention("market", reconcile_interval=3600)
        async def handle(msg: fairq.Received) -> None:
            handled[msg.body] += 1
            await asyncio.sleep(0.005)

        task = asyncio.create_task(worker.run())
        try:
            while sum(handled.values()) < 100:  # noqa: ASYNC110 - the test's progress poll
                await asyncio.sleep(0.05)
            await _close_my_connection(amqp_url)  # mid-slice: 4 slices run
            dropped.set()
            deadline = time.monotonic() + 60

            async def left() -> int:
                return sum(k.backlog + k.in_flight for k in await a.key_stats(top=keys))

            # every message handled; every ticket gone (those whose message's ack went down
            # with the connection come back with it, or are found empty and dropped)
            while len(handled) < keys * per_key or await left():
                assert time.monotonic() < deadline, f"{len(handled)} handled, {await left()}"
                await asyncio.sleep(0.2)
        finally:
            worker.stop()
            await asyncio.wait_for(task, 15)
        assert not task.exception()
        assert dropped.is_set()
        for k in range(keys):
            for _ in range(100):  # a loaded machine may miss a heartbeat: reconnecting again
                try:
                    assert (await (await a.queue(f"s{k}")).stats()).visible == 0
                    break
                except fairq.ConnectionError:
                    await asyncio.sleep(0.2)
            else:
                raise AssertionError("the broker did not reconnect")
