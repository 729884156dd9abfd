"""SQLite counts small receives and acks later (schema 10): a receive of a few messages of
a non-FIFO queue keeps its lease's end negated and writes no queue row, an ack of a few
marks its rows acked (``avail_at`` -1 or -0.5, no lease); ``messages.settle`` counts them
(and deletes acked rows) every few hundred, before anything reads a queue's counters or
rows or moves a leased row otherwise, and when the writer closes. Counts stay exact, no
acked message comes back and an ended lease is redelivered on time, across processes
and crashes."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import fairq
from fairq.backends.sqlite import messages, writer
from sqlite_files import rows, wal_frames


def _acked_rows(db: Path) -> int:
    sql = (  # marked acked: at -1 or -0.5, or (schema 12) a receive not counted, lease -1
        "SELECT count(*) FROM fairq_messages WHERE (avail_at >= -1 AND avail_at < 0) OR lease = -1"
    )
    return int(rows(db, sql)[0][0])


async def test_an_ack_marks_its_row_and_the_counts_stay_exact(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    clock = fairq.ManualClock()
    async with await fairq.connect(f"sqlite:///{db}", clock=clock) as broker:
        q = await broker.declare_queue("q", visibility_timeout=30)
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(3)])
        got = await q.receive(max_messages=3)
        counted = rows(db, "SELECT acked, in_flight FROM fairq_queues")
        await q.ack_batch([m.receipt for m in got[:2]])
        assert _acked_rows(db) == 2
        assert rows(db, "SELECT acked, in_flight FROM fairq_queues") == counted  # unwritten
        clock.advance(60)  # every lease ended: the third comes back, the acked two do not
        (again,) = await q.receive(max_messages=10)
        assert again.body == b"m2"
        s = await q.stats()
        assert (s.sent, s.acked, s.in_flight, s.visible, s.depth) == (3, 2, 1, 0, 1), s
        assert _acked_rows(db) == 0  # the stats settled them first
        assert [m.body for m in await q.peek()] == [b"m2"]


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
        await q.send_batch([fairq.Outgoing(b"x") for _ in range(messages.LAZY_BELOW)])
        got = await q.receive(max_messages=messages.LAZY_BELOW)
        await q.ack_batch([m.receipt for m in got])
        assert _acked_rows(db) == 0
        assert rows(db, "SELECT count(*) FROM fairq_messages") == [(0,)]
        assert (await q.stats()).acked == messages.LAZY_BELOW


async def test_closing_settles_what_this_writer_acked(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("q")
        await q.send(b"x")
        (m,) = await q.receive()
        await m.ack()
        assert _acked_rows(db) == 1
    assert _acked_rows(db) == 0
    assert rows(db, "SELECT acked, in_flight FROM fairq_queues WHERE name = 'q'") == [(1, 0)]


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


_CHILD = """
import asyncio, os, sys

import fairq

async def main():
    broker = await fairq.connect(sys.argv[1])
    q = broker.queue("q")
    got = [(await q.receive(visibility_timeout=0.5))[0] for _ in range(int(sys.argv[2]))]
    for m in got[: int(sys.argv[3])]:
        await m.ack()
    os._exit(0)  # no close: its receives and acks stay uncounted in the file

asyncio.run(main())
"""


async def _receive_and_die(url: str, receive: int, ack: int) -> None:
    """A process receives ``receive`` messages one at a time (0.5 s leases), acks the first
    ``ack`` of them and dies without closing."""
    args = (url, str(receive), str(ack))
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _CHILD, *args)
    assert await proc.wait() == 0


async def test_rows_acked_by_a_process_that_died_are_settled_by_another(
    tmp_path: Path,
) -> None:
    db = tmp_path / "f.db"
    url = f"sqlite:///{db}"
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("q")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(5)])
        await _receive_and_die(url, 4, 4)
        assert _acked_rows(db) == 4
        await asyncio.sleep(0.6)  # past the acked leases' 0.5 s: still none comes back
        (left,) = await q.receive(max_messages=10)
        assert left.body == b"m4"
        s = await q.stats()
        assert (s.sent, s.acked, s.in_flight, s.visible) == (5, 4, 1, 0), s
        assert _acked_rows(db) == 0


async def test_a_small_receive_writes_two_pages_and_a_small_ack_two(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    n = 50
    async with await fairq.connect(f"sqlite:///{db}", clock=fairq.ManualClock()) as broker:
        q = await broker.declare_queue("q")
        for _ in range(n):
            await q.send(b"x" * 200)
        before = wal_frames(db)
        msgs = [(await q.receive())[0] for _ in range(n)]
        # the row and its delivery-order entry, moved next to the queue's head on the same
        # page (leased in place, schema 13; it entered the due-time index before, a third
        # page); no queue row (a counted receive writes four)
        assert (wal_frames(db) - before) / n < 2.5
        s = await q.stats()
        assert (s.visible, s.in_flight, s.sent) == (0, n, n), s
        before = wal_frames(db)
        for m in msgs:
            await m.ack()
        # the row's page and an ix_waiting page (now and then a third, as the index's
        # leaves change); no queue row, per-queue index or last id, as a delete writes
        assert (wal_frames(db) - before) / n < 2.5


async def test_an_ack_of_a_receive_not_counted_yet_writes_one_page(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    n = 50
    async with await fairq.connect(f"sqlite:///{db}", clock=fairq.ManualClock()) as broker:
        q = await broker.declare_queue("q")
        await q.send_batch([fairq.Outgoing(b"x" * 200) for _ in range(n)])
        msgs = [(await q.receive())[0] for _ in range(n)]  # their receives not counted yet
        before = wal_frames(db)
        for m in msgs:
            await m.ack()
        # the row's page alone: its lease becomes -1 and no index entry moves (it moved
        # to avail_at -0.5, an ix_waiting page, before schema 12); settling does the rest
        assert (wal_frames(db) - before) / n < 1.5
        assert _acked_rows(db) == n
        s = await q.stats()
        assert (s.sent, s.acked, s.in_flight, s.visible, s.redelivered) == (n, n, 0, 0, 0), s
        assert _acked_rows(db) == 0


async def test_leases_and_counts_of_small_receives_are_exact(tmp_path: Path) -> None:
    clock = fairq.ManualClock()
    async with await fairq.connect(f"sqlite:///{tmp_path / 'f.db'}", clock=clock) as broker:
        q = await broker.declare_queue("q", visibility_timeout=30)
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(4)])
        a, b, c, d = [(await q.receive())[0] for _ in range(4)]
        await a.nack()  # visible again at once
        assert await q.extend_batch([b.receipt], 100) == []
        assert await q.release_batch([c.receipt]) == []
        s = await q.stats()
        assert (s.visible, s.in_flight, s.nacked, s.redelivered) == (2, 2, 1, 0), s
        clock.advance(60)  # d's lease ends, b's (extended) does not
        again = await q.receive(max_messages=10)
        assert sorted(m.body for m in again) == [b"m0", b"m2", b"m3"]
        assert {m.body: m.attempt for m in again} == {b"m0": 2, b"m2": 1, b"m3": 2}
        await b.ack()
        assert await q.extend_batch([d.receipt], 10) == [d.receipt]  # d's first lease is over
        s = await q.stats()
        assert (s.visible, s.in_flight, s.acked, s.redelivered, s.depth) == (0, 3, 1, 2, 3)


async def test_receives_of_a_process_that_died_are_counted_and_redelivered(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("q")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(5)])
        await _receive_and_die(url, 3, 1)
        s = await q.stats()
        assert (s.visible, s.in_flight, s.acked) == (2, 2, 1), s
        # a long poll: the two leases end 0.5 s after their receive and come back then
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        got: list[fairq.Message] = []
        while len(got) < 4 and loop.time() - t0 < 5:
            got += await q.receive(max_messages=4, wait=2)
        assert sorted(m.body for m in got) == [b"m1", b"m2", b"m3", b"m4"]
        assert sorted(m.attempt for m in got) == [1, 1, 2, 2]
        s = await q.stats()
        assert (s.visible, s.in_flight, s.acked, s.redelivered) == (0, 4, 1, 2), s


async def test_a_big_ack_counts_the_small_receives_it_deletes(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}", clock=fairq.ManualClock()) as broker:
        q = await broker.declare_queue("q")
        n = messages.LAZY_BELOW
        await q.send_batch([fairq.Outgoing(b"x") for _ in range(n + 1)])
        got = [(await q.receive())[0] for _ in range(n)]  # each one uncounted
        await q.ack_batch([m.receipt for m in got])  # deleted at once, receives counted
        assert rows(db, "SELECT count(*) FROM fairq_messages") == [(1,)]
        s = await q.stats()
        assert (s.visible, s.in_flight, s.acked, s.redelivered) == (1, 0, n, 0), s
