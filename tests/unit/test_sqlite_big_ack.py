"""SQLite: an ack of many (``messages.LAZY_BELOW`` receipts or more) of plain rows deletes
them with a DELETE that returns nothing (no RETURNING: it halves the statement's cost). It
runs under a savepoint and is undone whenever it deletes fewer rows than its receipts name
(a lease gone, a receive not counted yet, a shared body, a group); the DELETE ... RETURNING
then does the whole chunk. Counts, lost receipts and shared bodies stay exact either way."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import fairq
from fairq.backends.sqlite import messages
from sqlite_files import rows


def _deletes(broker: fairq.Broker) -> tuple[list[str], object]:
    conn: sqlite3.Connection = broker.backend._writer.conn  # type: ignore[attr-defined]
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    return seen, conn


def _message_deletes(seen: list[str]) -> list[str]:
    return [s for s in seen if s.startswith("DELETE FROM fairq_messages")]


def count(db: Path, sql: str) -> int:
    return int(rows(db, sql)[0][0])


async def test_a_big_ack_of_plain_rows_returns_nothing(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("q")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(250)])
        got = await q.receive(max_messages=200)
        seen, conn = _deletes(broker)
        try:
            await q.ack_batch([m.receipt for m in got])
        finally:
            conn.set_trace_callback(None)  # type: ignore[attr-defined]
        deletes = _message_deletes(seen)
        assert deletes and not any("RETURNING" in s for s in deletes), deletes
        assert not any("ROLLBACK" in s for s in seen)
        s = await q.stats()
        assert (s.visible, s.in_flight, s.acked) == (50, 0, 200), s
    assert count(db, "SELECT count(*) FROM fairq_messages") == 50


async def test_a_lost_receipt_undoes_the_plain_delete(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("q")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(40)])
        got = await q.receive(max_messages=40)
        await got[7].ack()  # its receipt names no current lease any more
        seen, conn = _deletes(broker)
        try:
            with pytest.raises(fairq.LeaseLost) as lost:
                await q.ack_batch([m.receipt for m in got])
        finally:
            conn.set_trace_callback(None)  # type: ignore[attr-defined]
        assert lost.value.lost == [got[7].receipt]
        assert any("ROLLBACK TO" in s for s in seen)
        assert any("RETURNING" in s for s in _message_deletes(seen))
        s = await q.stats()
        assert (s.visible, s.in_flight, s.acked, s.depth) == (0, 0, 40, 0), s
    assert count(db, "SELECT count(*) FROM fairq_messages") == 0


async def test_a_receipt_repeated_in_a_big_ack_is_acked_once(tmp_path: Path) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'f.db'}") as broker:
        q = await broker.declare_queue("q")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(30)])
        got = await q.receive(max_messages=30)
        await q.ack_batch([m.receipt for m in got] + [got[0].receipt])
        s = await q.stats()
        assert (s.in_flight, s.acked, s.depth) == (0, 30, 0), s


async def test_a_big_ack_counts_small_receives_among_counted_ones(tmp_path: Path) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'f.db'}") as broker:
        q = await broker.declare_queue("q")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(50)])
        small = await q.receive(max_messages=2)  # not counted yet (its end negated)
        big = await q.receive(max_messages=40)  # counted at once
        await q.ack_batch([m.receipt for m in big + small])
        s = await q.stats()
        assert (s.visible, s.in_flight, s.acked, s.redelivered) == (8, 0, 42, 0), s
        assert {m.body for m in await q.receive(max_messages=10)} == {
            f"m{i}".encode() for i in range(42, 50)
        }


async def test_big_acks_of_shared_bodies_release_them(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        t = await broker.declare_topic("t")
        subs = [await t.subscribe(f"s{i}") for i in range(2)]
        await t.publish_batch([fairq.Outgoing(f"m{i}") for i in range(100)])
        assert count(db, "SELECT count(*) FROM fairq_bodies") == 100
        n = messages.LAZY_BELOW * 2
        for _ in range(2):  # the first big ack falls back; the next goes straight there
            seen, conn = _deletes(broker)
            try:
                await subs[0].ack_batch([m.receipt for m in await subs[0].receive(n)])
            finally:
                conn.set_trace_callback(None)  # type: ignore[attr-defined]
        assert not any("ROLLBACK" in s for s in seen)  # the second one
        assert (await subs[0].stats()).acked == 2 * n
        assert count(db, "SELECT count(*) FROM fairq_bodies WHERE refs = 1") == 2 * n
        await subs[1].ack_batch([m.receipt for m in await subs[1].receive(100)])
        await subs[0].ack_batch([m.receipt for m in await subs[0].receive(100)])
        assert (await subs[1].stats()).acked == 100
    assert count(db, "SELECT count(*) FROM fairq_bodies") == 0
