"""SPEC §11 on PostgreSQL: fairq inside the caller's own transaction — the outbox (send,
send_batch, Topic.publish, Attention.publish) and the inbox (Received.ack,
IdempotencyStore.claim) — with commits, rollbacks, a waiting consumer woken by the
commit, a SQLAlchemy AsyncSession, and a consumer killed between its write and its commit.
Other backends refuse ``connection=`` with ``Unsupported``."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

import fairq
from services import PG_SERVER, drop_namespace, pg_database, pg_url
from services import require as _require


@pytest.fixture
async def env() -> AsyncIterator[tuple[fairq.Broker, fairq.Broker, psycopg.AsyncConnection]]:
    """Two brokers on one schema (a producer's and a consumer's) and the application's
    own connection, with an ``orders`` table of its own beside fairq's."""
    _require("postgres")
    url = pg_url()
    app = await fairq.connect(url)
    other = await fairq.connect(url)
    conn = await psycopg.AsyncConnection.connect(f"{PG_SERVER}/{pg_database()}")
    schema = url.rsplit("schema=", 1)[1]
    await conn.execute(f'CREATE TABLE "{schema}".orders (id int PRIMARY KEY, note text)')
    await conn.execute(f'SET search_path TO "{schema}"')
    await conn.commit()
    try:
        yield app, other, conn
    finally:
        await conn.close()
        await app.close()
        await other.close()
        drop_namespace(url)


async def _orders(conn: psycopg.AsyncConnection) -> int:
    cur = await conn.execute("SELECT count(*) FROM orders")
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def test_outbox_send_is_visible_only_after_commit(env: tuple) -> None:
    app, other, conn = env
    q = await app.declare_queue("emails")
    theirs = other.queue("emails")
    async with conn.transaction():
        await conn.execute("INSERT INTO orders VALUES (1, 'paid')")
        mid = await q.send({"order": 1}, connection=conn)
        await q.send_batch([fairq.Outgoing(b"a"), fairq.Outgoing(b"b")], connection=conn)
        assert await theirs.receive(max_messages=10) == []  # not committed yet
        assert (await theirs.stats()).visible == 0
    got = await theirs.receive(max_messages=10)
    assert got[0].id == mid and len(got) == 3
    assert got[0].json() == {"order": 1}


async def test_outbox_rollback_leaves_nothing(env: tuple) -> None:
    app, other, conn = env
    q = await app.declare_queue("emails")
    with pytest.raises(RuntimeError):
        async with conn.transaction():
            await conn.execute("INSERT INTO orders VALUES (2, 'paid')")
            await q.send(b"x", connection=conn)
            raise RuntimeError("the order failed")
    assert await _orders(conn) == 0
    s = await other.queue("emails").stats()
    assert (s.visible, s.sent) == (0, 0)
    assert await other.queue("emails").receive() == []


async def test_a_failed_fairq_step_leaves_the_callers_transaction_usable(env: tuple) -> None:
    app, _, conn = env
    q = await app.declare_queue("bounded", max_length=1)
    await q.send(b"first")
    async with conn.transaction():
        await conn.execute("INSERT INTO orders VALUES (3, 'paid')")
        with pytest.raises(fairq.QueueFull):
            await q.send(b"second", connection=conn)  # a savepoint of the caller's
        await conn.execute("INSERT INTO orders VALUES (4, 'paid')")
    assert await _orders(conn) == 2
    assert (await q.stats()).sent == 1


async def test_outbox_commit_wakes_a_waiting_consumer_elsewhere(env: tuple) -> None:
    app, other, conn = env
    q = await app.declare_queue("wake")
    waiting = asyncio.create_task(other.queue("wake").receive(wait=5))
    await asyncio.sleep(0.3)  # the consumer is waiting (and listening)
    async with conn.transaction():
        await q.send(b"x", connection=conn)
        await asyncio.sleep(0.3)
        assert not waiting.done()  # a send not committed wakes nobody
        committed = time.monotonic()
    got = await asyncio.wait_for(waiting, 5)
    assert [m.body for m in got] == [b"x"]
    assert time.monotonic() - committed < 0.5, "the commit's NOTIFY should wake the consumer"


async def test_outbox_publish_and_attention_publish(env: tuple) -> None:
    app, other, conn = env
    topic = await app.declare_topic("orders")
    sub = await topic.subscribe("billing")
    market = await app.declare_attention("market")
    with pytest.raises(RuntimeError):
        async with conn.transaction():
            await topic.publish(b"lost", connection=conn)
            await market.publish("store-1", b"lost", connection=conn)
            raise RuntimeError
    assert (await sub.stats()).sent == 0
    assert (await market.stats()).signals_pending == 0
    async with conn.transaction():
        r = await topic.publish(b"kept", connection=conn)
        assert r.subscriptions == ["billing"]
        await market.publish("store-1", b"kept", connection=conn)
        assert await other.backend.attention_take("market") is None  # no signal yet
    assert [m.body for m in await other.queue("orders.billing").receive()] == [b"kept"]
    slice_ = await other.backend.attention_take("market")
    assert slice_ is not None and slice_.key == "store-1"


async def test_inbox_ack_commits_with_the_consumers_write(env: tuple) -> None:
    app, _, conn = env
    q = await app.declare_queue("orders-in", visibility_timeout=30)
    await q.send(b"5")
    (m,) = await q.receive()
    with pytest.raises(RuntimeError):
        async with conn.transaction():
            await conn.execute("INSERT INTO orders VALUES (5, 'shipped')")
            await m.ack(connection=conn)
            raise RuntimeError("crash before commit")
    s = await q.stats()
    assert (s.in_flight, s.acked) == (1, 0)  # the lease is as it was
    async with conn.transaction():
        await conn.execute("INSERT INTO orders VALUES (5, 'shipped')")
        await m.ack(connection=conn)
    s = await q.stats()
    assert (s.in_flight, s.visible, s.acked) == (0, 0, 1)
    assert await _orders(conn) == 1
    with pytest.raises(fairq.LeaseLost):
        async with conn.transaction():
            await m.ack(connection=conn)  # acked already


async def test_inbox_claim_commits_or_vanishes_with_the_transaction(env: tuple) -> None:
    app, other, conn = env
    store = app.idempotency("inbox", ttl=3600)
    theirs = other.idempotency("inbox", ttl=3600)
    with pytest.raises(RuntimeError):
        async with conn.transaction():
            assert await store.claim("evt-1", connection=conn) is not None
            raise RuntimeError
    assert await theirs.get("evt-1") is None  # rolled back: free again
    async with conn.transaction():
        assert await store.claim("evt-1", connection=conn) is not None
        # a concurrent claim of the key waits for this transaction, then finds it done
        racing = asyncio.create_task(theirs.claim("evt-1"))
        await asyncio.sleep(0.2)
        assert not racing.done()
    assert await racing is None
    record = await theirs.get("evt-1")
    assert record is not None and record.completed
    async with conn.transaction():
        assert await store.claim("evt-1", connection=conn) is None  # a duplicate


async def test_an_inbox_claim_completes_and_releases_in_the_callers_transaction(
    env: tuple,
) -> None:
    """The claim ``claim(connection=conn)`` returns stores its result, or frees its key, on
    the caller's connection: at once, and committed or rolled back with it (through the
    pool it waited on the caller's own uncommitted row for the pool's timeout, then failed
    and took the caller's transaction with it)."""
    app, other, conn = env
    store = app.idempotency("inbox-done", ttl=3600)
    theirs = other.idempotency("inbox-done", ttl=3600)
    async with conn.transaction():
        claim = await store.claim("evt-2", connection=conn)
        assert claim is not None
        claim.keep_alive()  # nothing to keep: the record is done already
        await claim.extend()
        started = time.monotonic()
        await claim.complete({"mailed": True})
        assert time.monotonic() - started < 2
        with pytest.raises(fairq.ClaimLost):
            await claim.complete()
    record = await theirs.get("evt-2")
    assert record is not None and record.completed
    assert record.result == {"mailed": True}
    async with conn.transaction():
        claim = await store.claim("evt-3", connection=conn)
        assert claim is not None
        assert await claim.release()  # the work will not be done after all
    assert await theirs.get("evt-3") is None
    again = await theirs.claim("evt-3")
    assert again is not None
    await again.complete()


async def test_sqlalchemy_async_session_and_connection(env: tuple) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    app, other, conn = env
    q = await app.declare_queue("sa")
    schema = app.url.rsplit("schema=", 1)[1]
    engine = create_async_engine(f"postgresql+psycopg://postgres@127.0.0.1:5432/{pg_database()}")
    try:
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(
                sqlalchemy.text(f"INSERT INTO \"{schema}\".orders VALUES (7, 'sa')")
            )
            await q.send(b"from-session", connection=session)
            assert await other.queue("sa").receive() == []
        async with engine.connect() as sa_conn:
            await q.send(b"rolled-back", connection=sa_conn)
            await sa_conn.rollback()
        got = await other.queue("sa").receive(max_messages=5)
        assert [m.body for m in got] == [b"from-session"]
        async with AsyncSession(engine) as session, session.begin():
            await got[0].ack(connection=session)
        assert (await q.stats()).acked == 1
    finally:
        await engine.dispose()
    assert await _orders(conn) == 1


async def test_a_blocking_connection_is_refused(env: tuple) -> None:
    app, _, _ = env
    q = await app.declare_queue("sync")
    with (
        psycopg.connect(f"{PG_SERVER}/{pg_database()}") as blocking,
        pytest.raises(fairq.InvalidOption, match="AsyncConnection"),
    ):
        await q.send(b"x", connection=blocking)


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_other_backends_refuse_connection(backend: str, tmp_path: Path) -> None:
    url = "memory://" if backend == "memory" else f"sqlite:///{tmp_path / 'x.db'}"
    async with await fairq.connect(url) as b:
        q = await b.declare_queue("q")
        topic = await b.declare_topic("t")
        market = await b.declare_attention("m")
        store = b.idempotency("i")
        fake = object()
        for attempt in (
            q.send(b"x", connection=fake),
            q.send_batch([fairq.Outgoing(b"x")], connection=fake),
            topic.publish(b"x", connection=fake),
            market.publish("k", b"x", connection=fake),
            store.claim("k", connection=fake),
        ):
            with pytest.raises(fairq.Unsupported):
                await attempt
        await q.send(b"x")
        (m,) = await q.receive()
        with pytest.raises(fairq.Unsupported):
            await m.ack(connection=fake)
        assert (await q.stats()).sent == 1


# -- the inbox survives a kill -9 between the consumer's write and its commit ---------------
_CONSUMER = textwrap.dedent(
    """
    import asyncio, sys, time
    import psycopg, fairq

    async def main(url, db, schema, hang):
        broker = await fairq.connect(url)
        q = broker.queue("payments")
        (m,) = await q.receive(wait=10)
        async with await psycopg.AsyncConnection.connect(db) as conn:
            async with conn.transaction():
                await conn.execute(
                    f'INSERT INTO "{schema}".effects (payment, attempt) VALUES (%s, %s)',
                    (m.body.decode(), m.attempt))
                await m.ack(connection=conn)
                print("written", flush=True)
                if hang:
                    time.sleep(60)  # killed here: written, acked, not committed
        print("committed", flush=True)
        await broker.close()

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "hang"))
    """
)


def test_inbox_effect_applied_exactly_once_across_a_kill(tmp_path: Path) -> None:
    _require("postgres")
    url = pg_url()
    schema = url.rsplit("schema=", 1)[1]
    db = f"{PG_SERVER}/{pg_database()}"
    script = tmp_path / "consumer.py"
    script.write_text(_CONSUMER)

    async def setup() -> None:
        async with await fairq.connect(url) as b:
            q = await b.declare_queue("payments", visibility_timeout=1.0)
            await q.send(b"pay-42")

    try:
        asyncio.run(setup())
        with psycopg.connect(db, autocommit=True) as c:
            c.execute(
                f'CREATE TABLE "{schema}".effects (payment text UNIQUE, attempt int NOT NULL)'
            )
        first = subprocess.Popen(
            [sys.executable, str(script), url, db, schema, "hang"],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert first.stdout is not None
        assert first.stdout.readline().strip() == "written"
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        second = subprocess.run(
            [sys.executable, str(script), url, db, schema, "commit"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert "committed" in second.stdout, second.stderr
        with psycopg.connect(db) as c:
            rows = c.execute(f'SELECT payment, attempt FROM "{schema}".effects').fetchall()
        assert rows == [("pay-42", 2)], "the effect is applied once, by the redelivery"

        async def check() -> fairq.QueueStats:
            async with await fairq.connect(url) as b:
                return await b.queue("payments").stats()

        s = asyncio.run(check())
        assert (s.visible, s.in_flight, s.acked, s.redelivered) == (0, 0, 1, 1)
    finally:
        drop_namespace(url)
