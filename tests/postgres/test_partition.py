"""SPEC §10 rule 2 on PostgreSQL through a network that fails: the broker talks to a cluster
of the test's own through a TCP proxy that can blackhole every connection (sockets stay
open, no byte goes through, new connections are accepted and never answered: a pulled
cable, a firewall dropping packets, a server that hangs) or reset them all. Every
operation raises ``fairq.ConnectionError`` within its timeout — never later, whatever it
was waiting on — and the same broker, a long poll and a Worker carry on once the network
is back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any

import psycopg
import pytest

import fairq
from services import require as _require

from .cluster import Cluster
from .proxy import Proxy

pytestmark = pytest.mark.slow

TIMEOUT = 2.0
#: what an operation may take past its timeout: the event loop's own lateness on a
#: loaded machine (the deadline itself is exact)
SLACK = 1.5


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    _require("postgres")
    c = Cluster()
    c.start()
    try:
        yield c
    finally:
        c.remove()


@pytest.fixture
def proxy(cluster: Cluster) -> Iterator[Proxy]:
    p = Proxy(cluster.port)
    p.start()
    try:
        yield p
    finally:
        p.close()


def _url(proxy: Proxy, schema: str) -> str:
    return (
        f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
        f"?schema={schema}&timeout={TIMEOUT:g}&connect_timeout=2"
    )


@pytest.fixture
async def broker(proxy: Proxy, request: pytest.FixtureRequest) -> AsyncIterator[fairq.Broker]:
    b = await fairq.connect(_url(proxy, request.node.name.replace("test_", "p_")[:40]))
    try:
        yield b
    finally:
        proxy.heal()
        await asyncio.wait_for(b.close(), 10)


async def _raises_in_time(op: Awaitable[Any], limit: float = TIMEOUT + SLACK) -> float:
    started = time.monotonic()
    with pytest.raises(fairq.ConnectionError):
        await asyncio.wait_for(op, 60)  # a hang fails here as a TimeoutError
    elapsed = time.monotonic() - started
    assert elapsed < limit, f"{op} took {elapsed:.1f} s, its timeout is {TIMEOUT:g} s"
    return elapsed


async def _back(q: fairq.Queue, body: bytes, within: float = 30.0) -> str:
    deadline = time.monotonic() + within
    while True:
        try:
            return await q.send(body)
        except fairq.ConnectionError:
            assert time.monotonic() < deadline, "the broker did not come back"
            await asyncio.sleep(0.2)


async def test_every_operation_raises_within_its_timeout_in_a_blackhole(
    broker: fairq.Broker, proxy: Proxy
) -> None:
    q = await broker.declare_queue("jobs", visibility_timeout=60)
    topic = await broker.declare_topic("events")
    await topic.subscribe("audit")
    market = await broker.declare_attention("market")
    store = broker.idempotency("charges")
    await q.send(b"held")
    (held,) = await q.receive()
    proxy.blackhole()
    # statements in flight on pooled connections, and waits for a connection that the
    # pool cannot open (the proxy accepts and never answers)
    for op in (
        q.send(b"lost?"),
        q.send_batch([fairq.Outgoing(b"a"), fairq.Outgoing(b"b")]),
        q.receive(),
        q.stats(),
        held.ack(),
        topic.publish(b"e"),
        market.publish("store-1", b"w"),
        store.claim("k1"),
        broker.list_queues(),
    ):
        await _raises_in_time(op)
    proxy.heal()
    mid = await _back(q, b"after")
    # the ack that raised may still have reached the server once the network was back (a
    # statement delayed, not lost): then the lease is gone; either way "held" is acked
    # once, and the rest goes on as before
    with contextlib.suppress(fairq.LeaseLost):
        await held.ack()
    bodies = [m.body for m in await q.peek(limit=100)]
    assert b"held" not in bodies
    got = await q.receive(max_messages=100, wait=5)
    assert mid in [m.id for m in got]


async def test_a_long_poll_in_a_blackhole_raises_and_the_wakeups_come_back(
    broker: fairq.Broker, proxy: Proxy, cluster: Cluster
) -> None:
    q = await broker.declare_queue("waits")
    # a long poll that idles (no statement in flight): the LISTEN connection's ping finds
    # the silence, the waiter polls, and its poll raises
    waiter = asyncio.create_task(q.receive(wait=60))
    await asyncio.sleep(0.5)
    proxy.blackhole()
    # the ping comes within 5 s of silence and gives up after the timeout; then the poll
    await _raises_in_time(waiter, 5.0 + 2 * TIMEOUT + SLACK)
    proxy.heal()
    await _back(q, b"wake-up test")
    await q.purge()
    # a send from another process's connection (not through the proxy) wakes a long poll
    # of this broker promptly again: LISTEN is back
    direct = f"{cluster.url}?schema={_schema(broker)}"
    listener = broker.backend.listener  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while not listener.listening:
        assert time.monotonic() < deadline, "the LISTEN connection did not come back"
        await asyncio.sleep(0.1)
    async with await fairq.connect(direct) as other:
        waiting = asyncio.create_task(q.receive(wait=30))
        await asyncio.sleep(0.3)
        sent_at = time.monotonic()
        mid = await other.queue("waits").send(b"ping")
        got = await asyncio.wait_for(waiting, 30)
        assert [m.id for m in got] == [mid]
        # woken by the NOTIFY: well before the safety poll (5 s) would have found it
        assert time.monotonic() - sent_at < 2.5


async def test_reset_connections_raise_at_once_and_a_worker_carries_on(
    broker: fairq.Broker, proxy: Proxy
) -> None:
    q = await broker.declare_queue("tasks")
    seen: list[bytes] = []
    worker = fairq.Worker(broker, concurrency=2)

    @worker.queue("tasks")
    async def handle(msg: fairq.Received) -> None:
        seen.append(msg.body)

    running = asyncio.create_task(worker.run())
    try:
        await q.send(b"one")
        deadline = time.monotonic() + 20
        while b"one" not in seen:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        proxy.blackhole()
        await asyncio.sleep(TIMEOUT + 1)  # the worker's receives time out meanwhile
        assert not running.done(), "the worker must keep running through a partition"
        proxy.cut()  # every connection reset: what was in flight fails now, not later
        elapsed = await _raises_in_time(q.stats())
        assert elapsed < TIMEOUT + SLACK
        proxy.heal()
        await _back(q, b"two")
        deadline = time.monotonic() + 30
        while b"two" not in seen:
            assert time.monotonic() < deadline, "the worker did not resume"
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 20)


async def test_the_callers_connection_in_a_blackhole(broker: fairq.Broker, proxy: Proxy) -> None:
    q = await broker.declare_queue("outbox")
    conninfo = _url(proxy, "x").split("?")[0]
    conn = await psycopg.AsyncConnection.connect(conninfo)
    try:
        await conn.execute("SELECT 1")  # the caller's transaction is open
        proxy.blackhole()
        # the server cannot be asked to cancel (the proxy answers nothing): the socket is
        # given up half a second past the timeout
        await _raises_in_time(q.send(b"in a transaction", connection=conn), TIMEOUT + 0.5 + SLACK)
        assert conn.broken or conn.closed or conn.pgconn.status != psycopg.pq.ConnStatus.OK
    finally:
        proxy.heal()
        await conn.close()
    await _back(q, b"after")
    assert [m.body for m in await q.peek(limit=10)] == [b"after"]


def _schema(broker: fairq.Broker) -> str:
    return str(broker.backend.options.schema)  # type: ignore[attr-defined]


async def test_a_statement_given_up_at_the_deadline_does_not_run_on(cluster: Cluster) -> None:
    """A server that answers but is stuck (a lock held elsewhere): the operation raises at
    its deadline, and the server's own statement_timeout ends the abandoned statement, so
    it does not commit later behind the caller's back."""
    url = f"{cluster.url}?schema=p_stuck&timeout=1&connect_timeout=2"
    async with await fairq.connect(url) as b:
        q = await b.declare_queue("bounded", max_length=10)  # a send locks the queue's row
        async with await psycopg.AsyncConnection.connect(cluster.url) as other:
            await other.execute("SELECT 1 FROM p_stuck.queues WHERE name = 'bounded' FOR UPDATE")
            started = time.monotonic()
            with pytest.raises(fairq.ConnectionError, match="no answer within 1 s"):
                await q.send(b"stuck")
            assert time.monotonic() - started < 1 + SLACK
            await asyncio.sleep(1.5)  # past the server's statement_timeout (1 s)
            await other.rollback()  # the lock goes: an abandoned send would commit now
        await asyncio.sleep(0.3)
        assert await q.peek(limit=10) == []
        await q.send(b"fine")
        assert [m.body for m in await q.peek(limit=10)] == [b"fine"]
