"""SQLite settles an ack later (schema 10): an ack of a non-FIFO queue marks its rows acked
(``avail_at = -1``, no lease) and writes no queue row; ``messages.settle_acks`` deletes
them and counts them every few hundred acks, before any read of the queue's counters or
rows, and when the writer closes. Nothing reads an acked row as a message: counts stay
exact, no acked message comes back, across processes and crashes."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from pathlib import Path

import fairq
from fairq.backends.sqlite import messages, writer


def _raw(db: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _acked_rows(db: Path) -> int:
    return int(_raw(db, "SELECT count(*) FROM fairq_messages WHERE avail_at < 0")[0][0])


def _frames(db: Path) -> int:
    wal = Path(f"{db}-wal")
    return wal.stat().st_size // (4096 + 24) if wal.exists() else 0


async def test_an_ack_marks_its_row_and_the_counts_stay_exact(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    clock = fairq.ManualClock()
    async with await fairq.connect(f"sqlite:///{db}", clock=clock) as broker:
        q = await broker.declare_queue("q", visibility_timeout=30)
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(3)])
        got = await q.receive(max_messages=3)
        counted = _raw(db, "SELECT acked, in_flight FROM fairq_queues")
        await q.ack_batch([m.receipt for m in got[:2]])
        assert _acked_rows(db) == 2
        assert _raw(db, "SELECT acked, in_flight FROM fairq_queues") == counted  # unwritten
        clock.advance(60)  # every lease ended: the third comes back, the acked two do not
        (again,) = await q.receive(max_messages=10)
        assert again.body == b"m2"
        s = await q.stats()
        assert (s.sent, s.acked, s.in_flight, s.visible, s.depth) == (3, 2, 1, 0, 1), s
        assert _acked_rows(db) == 0  # the stats settled them first
        assert [m.body for m in await q.peek()] == [b"m2"]


async def test_an_ack_writes_two_pages(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}", clock=fairq.ManualClock()) as broker:
        q = await broker.declare_queue("q")
        for _ in range(50):
            await q.send(b"x" * 200)
        msgs = [(await q.receive())[0] for _ in range(50)]
        before = _frames(db)
        for m in msgs:
            await m.ack()
        # the row's page and an ix_waiting page (now and then a third, as the index's
        # leaves change); no queue row, index by queue or last id, as a delete writes
        assert (_frames(db) - before) / len(msgs) < 2.5


async def test_acked_rows_are_settled_every_few_hundred(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    n = writer._SETTLE_ROWS * 3
    async with await fairq.connect(f"sqlite:///{db}", clock=fairq.ManualClock()) as broker:
        q = await broker.declare_queue("q")
        await q.send_batch([fairq.Outgoing(b"x") for _ in range(n)])
        most = 0
        for _ in range(n):
            (m,) = await q.receive()
            await m.ack()
            most = max(most, _acked_rows(db))
        assert most <= writer._SETTLE_ROWS
        assert (await q.stats()).acked == n
    assert _acked_rows(db) == 0


async def test_a_big_ack_deletes_at_once(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("q")
        await q.send_batch([fairq.Outgoing(b"x") for _ in range(messages._MARK_BELOW)])
        got = await q.receive(max_messages=messages._MARK_BELOW)
        await q.ack_batch([m.receipt for m in got])
        assert _acked_rows(db) == 0
        assert _raw(db, "SELECT count(*) FROM fairq_messages") == [(0,)]
        assert (await q.stats()).acked == messages._MARK_BELOW


async def test_closing_settles_what_this_writer_acked(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("q")
        await q.send(b"x")
        (m,) = await q.receive()
        await m.ack()
        assert _acked_rows(db) == 1
    assert _acked_rows(db) == 0
    assert _raw(db, "SELECT acked, in_flight FROM fairq_queues WHERE name = 'q'") == [(1, 0)]


async def test_a_bounded_queue_does_not_count_acked_rows(tmp_path: Path) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'f.db'}") as broker:
        q = await broker.declare_queue("q", max_length=2)
        for _ in range(3):
            await q.send_batch([fairq.Outgoing(b"a"), fairq.Outgoing(b"b")])
            got = await q.receive(max_messages=2)
            await q.ack_batch([m.receipt for m in got])  # room for the next two


async def test_a_fifo_queue_moves_its_groups_on_at_the_ack(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("q", fifo=True)
        await q.send_batch([fairq.Outgoing(f"m{i}", group="g") for i in range(2)])
        (first,) = await q.receive(max_messages=2)
        await first.ack()
        assert _acked_rows(db) == 0  # deleted at once: the next of the group is up
        (second,) = await q.receive(max_messages=2)
        assert second.body == b"m1"


_ACKER = """
import asyncio, os, sys

import fairq

async def main():
    broker = await fairq.connect(sys.argv[1])
    q = broker.queue("q")
    for m in await q.receive(max_messages=int(sys.argv[2]), visibility_timeout=0.5):
        await m.ack()
    os._exit(0)  # no close: the acked rows stay marked in the file

asyncio.run(main())
"""


async def test_rows_acked_by_a_process_that_died_are_settled_by_another(
    tmp_path: Path,
) -> None:
    db = tmp_path / "f.db"
    url = f"sqlite:///{db}"
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("q")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(5)])
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _ACKER, url, "4")
        assert await proc.wait() == 0
        assert _acked_rows(db) == 4
        await asyncio.sleep(0.6)  # past the acked leases' 0.5 s: still none comes back
        (left,) = await q.receive(max_messages=10)
        assert left.body == b"m4"
        s = await q.stats()
        assert (s.sent, s.acked, s.in_flight, s.visible) == (5, 4, 1, 0), s
        assert _acked_rows(db) == 0
