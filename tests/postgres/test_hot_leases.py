"""Hot leases on PostgreSQL (migration 9): a lease of a plain queue updates its row in
place and is recorded in ``leases``; these tests check what that design must keep — the
records and the ``hot`` counter follow every way a lease ends, nothing of them is left
behind, the cap parks leases past ``hot_limit()``, and leases taken before the upgrade
stay good after it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import psycopg
import pytest

import fairq
from fairq.backends.postgres import migrate
from services import PG_SERVER, drop_namespace, pg_database, pg_url
from services import require as _require

T0 = 1_800_000_000.0


@pytest.fixture
async def env() -> AsyncIterator[tuple[fairq.Broker, psycopg.AsyncConnection, str]]:
    """A broker on a manual clock, a connection to look at its tables, and the schema."""
    _require("postgres")
    url = pg_url()
    broker = await fairq.connect(url, clock=fairq.ManualClock())
    conn = await psycopg.AsyncConnection.connect(f"{PG_SERVER}/{pg_database()}", autocommit=True)
    try:
        yield broker, conn, url.rsplit("schema=", 1)[1]
    finally:
        await conn.close()
        await broker.close()
        drop_namespace(url)


async def _one(conn: psycopg.AsyncConnection, query: str) -> int:
    cur = await conn.execute(query)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0] or 0)


async def _hot(conn: psycopg.AsyncConnection, s: str) -> tuple[int, int, int]:
    """(hot leases by the counter, hot leases by the rows, lease records)."""
    return (
        await _one(conn, f'SELECT sum(hot) FROM "{s}".counts'),
        await _one(
            conn,
            f'SELECT count(*) FROM "{s}".messages WHERE lease IS NOT NULL AND avail_at < until',
        ),
        await _one(conn, f'SELECT count(*) FROM "{s}".leases'),
    )


async def test_every_way_a_hot_lease_ends_keeps_its_records(env: tuple) -> None:
    broker, conn, s = env
    clock: fairq.ManualClock = broker.clock  # type: ignore[assignment]
    q = await broker.declare_queue("hot", visibility_timeout=10, max_attempts=5)
    await q.send_batch([fairq.Outgoing(str(i)) for i in range(10)])
    msgs = await q.receive(max_messages=10)
    assert await _hot(conn, s) == (10, 10, 1)
    await q.ack_batch([m.receipt for m in msgs[:3]])  # part of the receive: the record shrinks
    assert await _hot(conn, s) == (7, 7, 1)
    assert await _one(conn, f'SELECT cardinality(ids) FROM "{s}".leases') == 7
    await msgs[3].nack()
    await msgs[4].dead_letter("bad")
    await msgs[5].extend(30)  # an extended lease is parked: no longer hot
    assert await q.release_batch([msgs[6].receipt]) == []
    assert await _hot(conn, s) == (3, 3, 1)
    st = await q.stats()
    assert (st.visible, st.in_flight, st.delayed) == (2, 4, 0)
    clock.advance(11)  # the hot ones run out: visible again, their record goes
    st = await q.stats()
    assert (st.visible, st.in_flight) == (5, 1)
    assert await _hot(conn, s) == (0, 0, 0)
    again = await q.receive(max_messages=10)
    assert sorted(m.body for m in again) == [b"3", b"6", b"7", b"8", b"9"]
    await q.ack_batch([m.receipt for m in again])  # a whole receive acked: its record goes
    assert await _hot(conn, s) == (0, 0, 0)


async def test_a_lease_that_ran_out_comes_back_in_the_order_it_became_visible(
    env: tuple,
) -> None:
    broker, _, _ = env
    clock: fairq.ManualClock = broker.clock  # type: ignore[assignment]
    q = await broker.declare_queue("order", visibility_timeout=5)
    await q.send(b"first")
    assert len(await q.receive()) == 1
    clock.advance(1)
    await q.send(b"second")  # visible at 1
    clock.advance(10)  # first's lease ran out at 5: it is behind second
    assert [m.body for m in await q.receive(max_messages=5)] == [b"second", b"first"]


async def test_past_the_cap_leases_are_parked_and_counted_alike(env: tuple) -> None:
    broker, conn, s = env
    clock: fairq.ManualClock = broker.clock  # type: ignore[assignment]
    limit = await _one(conn, f'SELECT "{s}".hot_limit()')
    q = await broker.declare_queue("cap", visibility_timeout=10)
    n = limit + 150
    for i in range(0, n, 500):
        await q.send_batch([fairq.Outgoing(b"x") for _ in range(min(500, n - i))])
    got = []
    while len(got) < n:
        got += await q.receive(max_messages=400)
    hot, rows, _ = await _hot(conn, s)
    assert hot == rows == limit  # the rest were parked (the lease of before migration 9)
    st = await q.stats()
    assert (st.visible, st.in_flight) == (0, n)
    await q.ack_batch([m.receipt for m in got[:100]])
    assert (await q.stats()).in_flight == n - 100
    clock.advance(11)
    st = await q.stats()
    assert (st.visible, st.in_flight) == (n - 100, 0)
    assert len(await q.receive(max_messages=n)) == n - 100


async def test_purge_and_delete_leave_no_lease_records(env: tuple) -> None:
    broker, conn, s = env
    q = await broker.declare_queue("gone")
    await q.send_batch([fairq.Outgoing(b"x") for _ in range(5)])
    await q.receive(max_messages=3)
    assert await q.purge() == 5
    assert await _hot(conn, s) == (0, 0, 0)
    await q.send_batch([fairq.Outgoing(b"x") for _ in range(5)])
    await q.receive(max_messages=3)
    assert await broker.delete_queue("gone")
    assert await _one(conn, f'SELECT count(*) FROM "{s}".leases') == 0


async def test_leases_taken_before_the_upgrade_stay_good() -> None:
    """A schema at migration 8 with a message in flight is upgraded: the receipt of its
    lease still acks it, and another one still in flight comes back when its lease ends."""
    _require("postgres")
    url = pg_url()
    s = url.rsplit("schema=", 1)[1]
    async with await psycopg.AsyncConnection.connect(
        f"{PG_SERVER}/{pg_database()}", autocommit=True
    ) as c:
        await migrate.apply(c, s, "ch", 8)
        config = orjson.dumps(fairq.QueueConfig(dead_letter=None).to_dict()).decode()
        await c.execute(
            f'INSERT INTO "{s}".queues (name, config, created_at, visibility_timeout, '
            "max_attempts, dead_letter, retention, max_length, overflow, fifo, max_priority, "
            "dedup_window) VALUES ('old', %s::jsonb, %s, 30, 5, NULL, 1209600, NULL, "
            "'reject', false, 0, 300)",
            (config, T0),
        )
        await c.execute(
            f'SELECT "{s}".send(%s, %s, %s::bytea[], NULL, NULL, NULL, NULL, NULL)',
            ("old", T0, [b"a", b"b"]),
        )
        cur = await c.execute(
            f'SELECT id, lease FROM "{s}".receive(%s, %s, %s, %s) ORDER BY ord',
            ("old", T0, 2, 30.0),
        )
        leased = await cur.fetchall()
    try:
        clock = fairq.ManualClock(T0 + 10)
        async with await fairq.connect(url, clock=clock) as broker:  # migrates to the end
            q = broker.queue("old")
            (mid, lease), _ = leased
            await q.ack_batch([fairq.message.make_receipt(mid, lease)])
            st = await q.stats()
            assert (st.visible, st.in_flight) == (0, 1)
            clock.advance(30)
            (m,) = await q.receive()
            assert (m.body, m.attempt) == (b"b", 2)
    finally:
        drop_namespace(url)


async def test_the_ack_function_of_before_still_acks(env: tuple) -> None:
    """A process still running the code of before migration 9 (during an upgrade) acks
    with ``ack()``: it keeps its signature and acks hot leases like ``ack_batch()``."""
    broker, conn, s = env
    q = await broker.declare_queue("old-code")
    await q.send_batch([fairq.Outgoing(b"x") for _ in range(3)])
    msgs = await q.receive(max_messages=3)
    ids = [int(m.id, 16) for m in msgs]
    leases = [int(m.receipt.split(".")[1], 16) for m in msgs]
    cur = await conn.execute(
        f'SELECT "{s}".ack(%s, %s, %s::bigint[], %s::bigint[])',
        ("old-code", broker.clock.now(), [ids[0], ids[1], ids[2]], [leases[0], leases[1], 7]),
    )
    row = await cur.fetchone()
    assert row is not None and row[0] == [3]  # the third receipt is not current
    assert await _hot(conn, s) == (1, 1, 1)
    assert (await q.stats()).in_flight == 1
