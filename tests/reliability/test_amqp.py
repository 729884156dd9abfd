"""Resilience on RabbitMQ (SPEC §10 rule 2, issue 13): dropped connections, a broker killed
and restarted, consumers and producers killed with -9.

The shared broker is never stopped: a dropped connection is its ``close_connection``
(management API) on our own connection; the restart test runs a node of its own
(``rabbitnode.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from rabbitnode import RabbitNode, available
from test_crash import read_line, spawn

import fairq
from services import rabbit_management, rabbit_vhost

pytestmark = pytest.mark.slow


@pytest.fixture
def amqp_url(tmp_path: Path) -> Iterator[str]:
    """A vhost of this test's own on the shared broker."""
    with rabbit_vhost() as vhost:
        yield (
            f"amqp://guest:guest@127.0.0.1:5672/{vhost}?store=sqlite:///{tmp_path / 's.db'}"
            f"&name=fairq-test-{uuid.uuid4().hex[:8]}"
        )


def _connection_names(url: str) -> list[str]:
    mine = url.rsplit("name=", 1)[1]
    api = rabbit_management()
    return [
        c["name"]
        for c in api.connections()
        if c.get("client_properties", {}).get("connection_name") == mine
    ]


async def _close_my_connection(url: str) -> None:
    api = rabbit_management()
    deadline = time.monotonic() + 10
    names: list[str] = []
    while not names and time.monotonic() < deadline:  # the API samples connections
        names = await asyncio.to_thread(_connection_names, url)
        if not names:
            await asyncio.sleep(0.2)
    assert names, "the broker's connection never showed in the management API"
    for name in names:
        await asyncio.to_thread(api.close_connection, name)


async def test_a_dropped_connection_reconnects_and_goes_on(amqp_url: str) -> None:
    async with await fairq.connect(amqp_url) as broker:
        q = await broker.declare_queue("work")
        await q.send(b"before")
        (held,) = await q.receive()
        await _close_my_connection(amqp_url)
        # during the outage calls fail fast with ConnectionError, then work again
        deadline = time.monotonic() + 20
        sent = None
        while sent is None and time.monotonic() < deadline:
            try:
                sent = await q.send(b"after")
            except fairq.ConnectionError:
                await asyncio.sleep(0.2)
        assert sent is not None, "the broker never reconnected"
        with pytest.raises(fairq.LeaseLost):
            await held.ack()  # the old connection's lease is gone: RabbitMQ took it back
        got = []
        while len(got) < 2 and time.monotonic() < deadline:
            for m in await q.receive(max_messages=10, wait=1):
                got.append(m.body)
                await m.ack()
        assert sorted(got) == [b"after", b"before"]


async def test_a_running_worker_survives_a_dropped_connection(amqp_url: str) -> None:
    async with await fairq.connect(amqp_url) as broker:
        q = await broker.declare_queue("jobs")
        done: list[bytes] = []
        seen = {b"1": asyncio.Event(), b"2": asyncio.Event()}
        worker = fairq.Worker(broker, handle_signals=False, poll_wait=0.2)

        @worker.queue("jobs")
        async def handle(msg: fairq.Received) -> None:
            done.append(msg.body)
            seen[msg.body].set()

        task = asyncio.create_task(worker.run())
        await q.send(b"1")
        deadline = time.monotonic() + 20
        await asyncio.wait_for(seen[b"1"].wait(), 10)
        await _close_my_connection(amqp_url)
        while time.monotonic() < deadline:
            try:
                await q.send(b"2")
                break
            except fairq.ConnectionError:
                await asyncio.sleep(0.2)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(seen[b"2"].wait(), max(0.1, deadline - time.monotonic()))
        worker.stop()
        await asyncio.wait_for(task, 10)
        assert b"2" in done, "the worker did not resume after the reconnect"
        assert not task.exception()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[RabbitNode]:
    if not available():
        if os.environ.get("FAIRQ_REQUIRE_SERVICES") == "1":
            pytest.fail("rabbitmq-server is not installed: cannot start a private node")
        pytest.skip("rabbitmq-server is not installed")
    n = RabbitNode(tmp_path / "node")
    n.start()
    try:
        yield n
    finally:
        n.stop()


async def _take_back(q: fairq.Queue, ids: list[str], deadline: float) -> Counter[str]:
    """Receive and ack from ``q`` after a broker restart until every id in ``ids`` came (or
    ``deadline``): how many times each id was delivered."""
    seen: Counter[str] = Counter()
    while len(seen) < len(ids) and time.monotonic() < deadline:
        try:
            for m in await q.receive(max_messages=100, wait=1):
                seen[m.id] += 1
                await m.ack()
        except fairq.ConnectionError:
            await asyncio.sleep(0.3)  # still reconnecting
    return seen


async def test_a_killed_broker_loses_no_confirmed_send(
    node: RabbitNode, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """... and says so in a few lines: the driver's log of each reconnect attempt (every
    0.5 s, at ERROR with tracebacks: a hundred lines a worker for a 16 s outage) comes
    once a minute, and an error names the outage once (it was nested in itself)."""
    url = f"{node.url_base}?store=sqlite:///{tmp_path / 's.db'}"
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("durable")
        prio = await broker.declare_queue("durable-prio", max_priority=3, max_length=1000)
        ids = await q.send_batch([fairq.Outgoing(str(i)) for i in range(300)])
        ids += [await q.send(b"one")]
        prio_ids = await prio.send_batch([fairq.Outgoing(b"p", priority=2) for _ in range(50)])
        (leased,) = await q.receive()
        await broker.backend.ping()
        caplog.clear()
        await asyncio.to_thread(node.kill)
        with pytest.raises(fairq.ConnectionError) as during:
            await q.send(b"during")
        assert "ConnectionError(" not in str(during.value), during.value
        with pytest.raises(fairq.ConnectionError):  # the health check asks RabbitMQ too
            await broker.backend.ping()
        await asyncio.sleep(3)  # six reconnect attempts
        await asyncio.to_thread(node.start)
        deadline = time.monotonic() + 60
        seen = await _take_back(q, ids, deadline)
        await broker.backend.ping()
        driver = [r for r in caplog.records if r.name.startswith(("aio_pika", "aiormq"))]
        assert len(driver) <= 8, [f"{r.name}: {r.getMessage()[:60]}" for r in driver]
        assert set(seen) == set(ids), f"{len(set(ids) - set(seen))} confirmed sends were lost"
        assert leased.id in seen
        got = []
        while len(got) < len(prio_ids) and time.monotonic() < deadline:
            got += [m.id for m in await prio.receive(max_messages=100, wait=1)]
        assert sorted(got) == sorted(prio_ids)


async def test_a_killed_broker_loses_no_delayed_message_between_hops(
    node: RabbitNode, tmp_path: Path
) -> None:
    """A delay walks down the wheel's level queues (``topology.py``), each hop a
    dead-lettering inside the broker. Killed with -9 while many messages hop between
    levels, the broker loses none of them once it is back: a hop leaves a level only
    when the next queue confirmed it (at-least-once dead-lettering), so a message may pass
    a hop twice but never vanishes between two."""
    url = f"{node.url_base}?store=sqlite:///{tmp_path / 's.db'}"
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("later")
        # delays of 0.2-1.4 s in 10 ms steps: each message passes several levels, so
        # hops go on at every level around the kill
        ids = await q.send_batch(
            [fairq.Outgoing(str(i), delay=0.2 + (i % 120) * 0.01) for i in range(1200)]
        )
        await asyncio.sleep(0.6)
        await asyncio.to_thread(node.kill)
        await asyncio.to_thread(node.start)
        seen = await _take_back(q, ids, time.monotonic() + 60)
        lost = set(ids) - set(seen)
        assert not lost, f"{len(lost)} of {len(ids)} delayed messages were lost in the wheel"


# -- kill -9 of consumers and producers --------------------------------------------------------
async def test_killed_consumer_loses_nothing_and_its_messages_return_at_once(
    amqp_url: str,
) -> None:
    async with await fairq.connect(amqp_url) as broker:
        q = await broker.declare_queue("work", visibility_timeout=300)
        ids = await q.send_batch([fairq.Outgoing(str(i)) for i in range(200)])
    child = spawn("hold", amqp_url, 50)
    leased = read_line(child, "leased").split()[1:]
    assert len(leased) == 50
    child.send_signal(signal.SIGKILL)
    child.wait()
    started = time.monotonic()
    async with await fairq.connect(amqp_url) as broker:
        q = broker.queue("work")
        seen: dict[str, int] = {}
        deadline = time.monotonic() + 20
        while len(seen) < 200 and time.monotonic() < deadline:
            for m in await q.receive(max_messages=100, wait=2):
                seen[m.id] = m.attempt
                await m.ack()
        assert time.monotonic() - started < 30, "they came back long before the 300 s lease"
        assert sorted(seen) == sorted(ids), "a message was lost"
        assert {seen[i] for i in leased} == {2}, "the killed consumer's deliveries count"
        s = await q.stats()
        assert (s.visible, s.in_flight, s.acked) == (0, 0, 200)


async def test_a_frozen_consumers_messages_return_when_rabbitmq_drops_it(amqp_url: str) -> None:
    """Only the holder ends its leases on RabbitMQ, so a consumer that freezes (SIGSTOP, a
    paused VM) keeps them until RabbitMQ drops its connection for missed heartbeats: fairq
    asks for 10 s (link.HEARTBEAT: ~30 s), here 2 s, instead of aiormq's 60 (~3 min)."""
    url = amqp_url + "&heartbeat=2"
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("work", visibility_timeout=300)
        await q.send_batch([fairq.Outgoing(str(i)) for i in range(10)])
    child = spawn("hold", url, 10)
    try:
        assert len(read_line(child, "leased").split()[1:]) == 10
        child.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        async with await fairq.connect(url) as broker:
            got: list[fairq.Received] = []
            while len(got) < 10 and time.monotonic() - started < 30:
                got += await broker.queue("work").receive(max_messages=10, wait=2)
            took = time.monotonic() - started
            assert len(got) == 10, "the frozen consumer's messages did not come back"
            assert took < 15, f"they came back after {took:.0f} s"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


async def test_killed_producer_loses_no_returned_batch(amqp_url: str) -> None:
    async with await fairq.connect(amqp_url) as broker:
        await broker.declare_queue("work")
    child = spawn("send", amqp_url, 250)
    acknowledged = -1
    kill_after = 8 + os.getpid() % 7
    while acknowledged < kill_after:
        acknowledged = int(read_line(child, "sent").split()[1])
    child.send_signal(signal.SIGKILL)
    child.wait()
    async with await fairq.connect(amqp_url) as broker:
        q = broker.queue("work")
        per_batch: Counter[str] = Counter()
        while batch := await q.receive(max_messages=1000, wait=0.5):
            per_batch.update(m.attributes["batch"] for m in batch)
            await q.ack_batch([m.receipt for m in batch])
    stored = {int(b) for b in per_batch}
    assert set(range(acknowledged + 1)) <= stored, "a batch that send_batch returned for is missing"
    partial = [b for b, n in per_batch.items() if n != 250]
    # capability 'batches.atomic': only the batch being published when it died may be partial
    assert len(partial) <= 1 and all(int(b) > acknowledged for b in partial), per_batch


async def test_one_producer_two_consumer_processes(amqp_url: str) -> None:
    async with await fairq.connect(amqp_url) as broker:
        q = await broker.declare_queue("work")
        consumers = [spawn("consume", amqp_url, 6.0) for _ in range(2)]
        for c in consumers:
            read_line(c, "ready")
        await asyncio.sleep(0.5)
        ids = []
        for _ in range(30):
            ids.append(await q.send(repr(time.time())))
            await asyncio.sleep(0.1)
    got: dict[str, float] = {}
    who: Counter[int] = Counter()
    for n, c in enumerate(consumers):
        out, _ = c.communicate(timeout=30)
        for line in out.splitlines():
            if line.startswith("got"):
                _, mid, latency = line.split()
                assert mid not in got, "a message was delivered twice"
                got[mid] = float(latency)
                who[n] += 1
    assert sorted(got) == sorted(ids)
    latencies = sorted(got.values())
    assert latencies[len(latencies) // 2] < 0.05, latencies  # pushed, not polled


async def test_a_dashboard_sees_other_processes_leases(amqp_url: str) -> None:
    """A broker that does not consume the queue reads in_flight from the management API."""
    async with await fairq.connect(amqp_url) as worker, await fairq.connect(amqp_url) as viewer:
        q = await worker.declare_queue("work")
        await q.send_batch([fairq.Outgoing(b"x") for _ in range(5)])
        held = await q.receive(max_messages=3)
        assert len(held) == 3
        deadline = time.monotonic() + 15  # RabbitMQ samples queue stats every 5 s
        s = await viewer.queue("work").stats()
        while s.in_flight < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            s = await viewer.queue("work").stats()
        assert s.in_flight >= 3, s  # the worker's prefetched deliveries count too
        assert s.sent == 5


async def test_a_lease_that_runs_out_while_the_store_is_away_comes_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A lease of this process runs out while its ``?store=`` is down: RabbitMQ alone gives
    the message back (the queue's configuration last read stands in for the store's), and
    a give-back that needs the store is tried again until it works. Before, the lease was
    forgotten while the delivery stayed unacked on the live channel: the message was out of
    everyone's reach until the process ended."""
    from redis_servers import RedisServer

    store = RedisServer(tmp_path, None, "--appendonly", "yes", "--appendfsync", "always").start()
    try:
        with rabbit_vhost() as vhost:
            url = f"amqp://guest:guest@127.0.0.1:5672/{vhost}?store={store.url}"
            async with await fairq.connect(url) as broker:
                q = await broker.declare_queue("held", visibility_timeout=3)
                await q.send(b"job")
                (first,) = await q.receive(wait=5)
                assert first.attempt == 1
                await asyncio.to_thread(store.kill)
                try:
                    await asyncio.sleep(4.5)  # the lease ran out after the config's 2 s cache
                finally:
                    await asyncio.to_thread(store.start)
                got = await q.receive(wait=10)
                assert [m.body for m in got] == [b"job"], "the expired lease never came back"
                assert got[0].attempt == 2
                await got[0].ack()
    finally:
        store.stop()
    assert "Traceback" not in caplog.text


async def test_plain_sends_go_on_while_the_store_is_away(tmp_path: Path) -> None:
    """The store holds queues' configurations and attention tickets; while it is down, a
    plain send uses what was last read of both (a send more than 2 s after the last read
    failed: whether the queue is an attention work queue was asked of the store again)."""
    from redis_servers import RedisServer

    store = RedisServer(tmp_path, None, "--appendonly", "yes", "--appendfsync", "always").start()
    try:
        with rabbit_vhost() as vhost:
            url = f"amqp://guest:guest@127.0.0.1:5672/{vhost}?store={store.url}"
            async with await fairq.connect(url) as broker:
                q = await broker.declare_queue("plain")
                await q.send(b"before")
                await asyncio.to_thread(store.kill)
                try:
                    await asyncio.sleep(2.5)  # past the caches' 2 s
                    await q.send(b"during")
                finally:
                    await asyncio.to_thread(store.start)
                got = await q.receive(max_messages=5, wait=5)
                assert sorted(m.body for m in got) == [b"before", b"during"]
                await q.ack_batch([m.receipt for m in got])
    finally:
        store.stop()
