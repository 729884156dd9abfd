"""SQLite leases in place (schema 13): a receive of a few messages of a queue without
priorities keeps its rows in state 0, their lease's end stored below every ready row, so
a row's delivery-order entry moves next to its queue's head and no due-time entry is
written (two B-tree pages a receive, not three). Such a row is never delivered twice
while leased, comes back when its lease ends, is acked or lost like any other, and
``messages.settle`` (through ``fairq_lazy``) counts it, across processes."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

import fairq
from fairq.backends.sqlite import messages
from sqlite_files import rows, wal_frames


def _in_place(db: Path) -> int:
    return int(
        rows(db, "SELECT count(*) FROM fairq_messages WHERE state = 0 AND avail_at < -1")[0][0]
    )


async def test_a_small_receive_leases_in_place_and_writes_two_pages(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    n = 60
    async with await fairq.connect(f"sqlite:///{db}", clock=fairq.ManualClock()) as broker:
        q = await broker.declare_queue("q")
        await q.send_batch([fairq.Outgoing(b"x" * 200) for _ in range(n)])
        before = wal_frames(db)
        for _ in range(n):
            await q.receive()
        assert (wal_frames(db) - before) / n < 2.3
        assert _in_place(db) == n
        assert rows(db, "SELECT queue_id FROM fairq_lazy") == [(1,)]
        s = await q.stats()  # settled first: counted, in state 1 with their lease's end
        assert (s.visible, s.in_flight, s.sent) == (0, n, n), s
        assert _in_place(db) == 0 and rows(db, "SELECT * FROM fairq_lazy") == []


async def test_a_queue_with_priorities_leases_the_other_way(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}", clock=fairq.ManualClock()) as broker:
        q = await broker.declare_queue("q", max_priority=5)
        await q.send_batch([fairq.Outgoing(f"m{i}", priority=i % 3) for i in range(6)])
        got = [(await q.receive())[0] for _ in range(3)]
        assert [m.priority for m in got] == [2, 2, 1]
        assert _in_place(db) == 0
        await got[0].ack()
        s = await q.stats()
        assert (s.visible, s.in_flight, s.acked) == (3, 2, 1), s


async def test_a_row_leased_in_place_comes_back_only_when_its_lease_ends(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    clock = fairq.ManualClock()
    async with await fairq.connect(f"sqlite:///{db}", clock=clock) as broker:
        q = await broker.declare_queue("q", visibility_timeout=30)
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(25)])
        (first,) = await q.receive()
        assert first.body == b"m0"
        small = await q.receive(max_messages=3)  # in place too, behind the first
        big = await q.receive(max_messages=20)  # counted at once: skips all four
        assert [m.body for m in small] == [b"m1", b"m2", b"m3"]
        assert [m.body for m in big] == [f"m{i}".encode() for i in range(4, 24)]
        assert [m.body for m in await q.receive(max_messages=10)] == [b"m24"]
        assert await q.receive() == []
        clock.advance(29.9)
        assert await q.receive() == []
        clock.advance(0.2)  # every lease has ended: all come back, oldest first
        again = await q.receive(max_messages=30)
        assert [m.body for m in again] == [f"m{i}".encode() for i in range(25)]
        assert {m.attempt for m in again} == {2}
        with pytest.raises(fairq.LeaseLost):
            await first.ack()
        s = await q.stats()
        assert (s.visible, s.in_flight, s.redelivered, s.acked) == (0, 25, 25, 0), s


async def test_acks_of_rows_leased_in_place_small_and_big(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    clock = fairq.ManualClock()
    async with await fairq.connect(f"sqlite:///{db}", clock=clock) as broker:
        q = await broker.declare_queue("q")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(40)])
        short = await q.receive(max_messages=2, visibility_timeout=5)  # in place
        long = [(await q.receive(visibility_timeout=60))[0] for _ in range(20)]  # in place
        await long[0].ack()  # a small ack: the row's lease becomes -1, nothing else
        assert rows(db, "SELECT count(*) FROM fairq_messages WHERE lease = -1") == [(1,)]
        clock.advance(10)  # the two short leases have ended, not the long ones
        with pytest.raises(fairq.LeaseLost) as lost:  # a big ack: those two are lost
            await q.ack_batch([m.receipt for m in long[1:] + short])
        assert sorted(lost.value.lost) == sorted(m.receipt for m in short)
        with pytest.raises(fairq.LeaseLost):
            await short[0].ack()  # a small ack of an ended lease in place: lost too
        s = await q.stats()
        assert (s.visible, s.in_flight, s.acked, s.depth) == (20, 0, 20, 20), s
        again = await q.receive(max_messages=40)
        assert sorted(m.body for m in again) == sorted(
            [b"m0", b"m1"] + [f"m{i}".encode() for i in range(22, 40)]
        )


async def test_settling_counts_in_place_rows_and_releases_their_bodies(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        t = await broker.declare_topic("t")
        subs = [await t.subscribe(f"s{i}") for i in range(2)]
        await t.publish_batch([fairq.Outgoing(f"m{i}") for i in range(4)])
        got = [(await subs[0].receive())[0] for _ in range(3)]
        assert _in_place(db) == 3
        for m in got[:2]:
            await m.ack()
        s = await subs[0].stats()
        assert (s.visible, s.in_flight, s.acked) == (1, 1, 2), s
        refs = rows(db, "SELECT refs FROM fairq_bodies ORDER BY id")
        assert refs == [(1,), (1,), (2,), (2,)]


async def test_redrive_leaves_a_row_leased_in_place(tmp_path: Path) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'f.db'}") as broker:
        src = await broker.declare_queue("src")
        dst = await broker.declare_queue("dst")
        await src.send_batch([fairq.Outgoing(f"m{i}") for i in range(3)])
        (held,) = await src.receive()
        assert await broker.redrive("src", to="dst") == 2
        assert sorted(m.body for m in await dst.receive(max_messages=5)) == [b"m1", b"m2"]
        await held.ack()
        s = await src.stats()
        assert (s.depth, s.acked) == (0, 1), s


async def test_a_long_poll_elsewhere_wakes_when_a_lease_in_place_ends(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    async with await fairq.connect(url) as one, await fairq.connect(url) as other:
        q = await one.declare_queue("q")
        waiting = other.queue("q")
        assert await waiting.receive() == []  # (the other's writer has looked: nothing due)
        await q.send(b"m")
        (m,) = await q.receive(visibility_timeout=0.5)
        assert m.attempt == 1
        # its long poll looks without the write lock: the lease's end is a due time there
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        (again,) = await waiting.receive(wait=5)
        assert again.body == b"m" and again.attempt == 2
        assert 0.3 < loop.time() - t0 < 2.5


async def test_leasing_in_place_waits_after_an_upgrade(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    url = f"sqlite:///{db}"
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("q")
        await q.send_batch([fairq.Outgoing(b"x"), fairq.Outgoing(b"y")])
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE fairq_lazy")
    conn.execute("UPDATE fairq_meta SET value = 12 WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    # a process of schema 12 may still write for half a second: it would deliver a row
    # leased in place again (state 0), so none is made until it has stopped
    async with await fairq.connect(url) as broker:
        assert len(await broker.queue("q").receive()) == 1
        assert _in_place(db) == 0
        assert rows(db, "SELECT state FROM fairq_messages WHERE lease IS NOT NULL") == [(1,)]
        conn = sqlite3.connect(db)
        conn.execute("UPDATE fairq_meta SET value = 0 WHERE key = 'formats_from'")
        conn.commit()
        conn.close()
    async with await fairq.connect(url) as broker:  # once the time has come
        q = broker.queue("q")
        (n,) = await q.receive()
        assert n.body == b"y" and _in_place(db) == 1
        s = await q.stats()  # (the one received in the grace stays leased)
        assert (s.in_flight, s.visible) == (2, 0), s


def test_lease_ends_of_rows_in_place_stay_below_every_ready_row() -> None:
    # a ready row's avail_at is a time (>= 0); a lease in place must sort below all of them
    # and keep its order: a later end above an earlier one
    ends = [0.0, 1.5, 1_800_000_000.25, 4_000_000_000.0]
    stored = [e - messages.LEASED_OFFSET for e in ends]
    assert all(s < -1 for s in stored) and stored == sorted(stored)
    assert [s + messages.LEASED_OFFSET for s in stored] == ends


async def test_a_queue_made_under_a_deleted_queues_id_gets_its_leases_back(
    tmp_path: Path,
) -> None:
    # SQLite gives a deleted queue's id (the greatest) to the next queue made: that queue is
    # not in fairq_lazy, whatever the deleted one was, or its leases would never end
    clock = fairq.ManualClock()
    async with await fairq.connect(f"sqlite:///{tmp_path / 'f.db'}", clock=clock) as broker:
        a = await broker.declare_queue("a", dead_letter=None)
        await a.send(b"old")
        await a.receive()
        await broker.delete_queue("a")
        b = await broker.declare_queue("b", dead_letter=None, visibility_timeout=5)
        await b.send(b"m")
        assert len(await b.receive()) == 1
        clock.advance(10)
        (again,) = await b.receive()
        assert (again.body, again.attempt) == (b"m", 2)


async def test_a_subscription_made_again_gets_its_leases_back(tmp_path: Path) -> None:
    clock = fairq.ManualClock()
    async with await fairq.connect(f"sqlite:///{tmp_path / 'f.db'}", clock=clock) as broker:
        t = await broker.declare_topic("t")
        sub = await t.subscribe("s", dead_letter=None)
        await t.publish(b"m")
        assert len(await sub.receive()) == 1
        await t.unsubscribe("s")
        sub = await t.subscribe("s", dead_letter=None, visibility_timeout=5)  # the same id
        await t.publish(b"n")
        assert len(await sub.receive()) == 1
        clock.advance(10)
        (again,) = await sub.receive()
        assert (again.body, again.attempt) == (b"n", 2)


async def test_a_lease_in_place_ends_for_acks_when_it_does_for_receives(tmp_path: Path) -> None:
    for past in (False, True):
        clock = fairq.ManualClock(1_800_000_000.123456)
        url = f"sqlite:///{tmp_path / f'f{past}.db'}"
        async with await fairq.connect(url, clock=clock) as broker:
            q = await broker.declare_queue("q")
            await q.send(b"m")
            (m,) = await q.receive(visibility_timeout=0.1)
            clock.advance(0.1 + (1e-6 if past else -1e-6))
            if past:
                (again,) = await q.receive()
                assert again.attempt == 2
                with pytest.raises(fairq.LeaseLost):
                    await m.ack()
            else:
                assert await q.receive() == []
                await m.ack()
                assert (await q.stats()).acked == 1


async def test_a_small_receive_with_the_clock_near_zero_is_not_an_ack(tmp_path: Path) -> None:
    # a lease's end negated must stay below -1, where acked rows are marked
    async with await fairq.connect(
        f"sqlite:///{tmp_path / 'f.db'}", clock=fairq.ManualClock(0.0)
    ) as broker:
        for name, top in (("flat", 0), ("ranked", 1)):
            q = await broker.declare_queue(name, max_priority=top)
            await q.send(b"x")
            (m,) = await q.receive(visibility_timeout=0.5)
            s = await q.stats()
            assert (s.in_flight, s.acked) == (1, 0), (name, s)
            await m.ack()
            assert (await q.stats()).acked == 1
