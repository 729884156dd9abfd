"""SQLite leases in state 3 (schema 14): a receive of 16 or more messages whose ids are one
run leases them out of every partial index (no delivery-order entry moved into the
due-time index, none for the ack to delete), counted at once, the run named in
``fairq_runs``. Such a row is never delivered twice while leased, comes back when its
lease ends, takes a nack, an extension or a small ack like any other, and
``messages.settle`` moves it to state 1, across processes and after a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

import fairq
from sqlite_files import rows


def _states(db: Path) -> dict[int, int]:
    return dict(rows(db, "SELECT state, count(*) FROM fairq_messages GROUP BY state"))


async def test_a_big_receive_of_a_run_leases_in_state_3_and_its_ack_deletes_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}", clock=fairq.ManualClock()) as broker:
        q = await broker.declare_queue("q")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(50)])
        got = await q.receive(max_messages=40)
        assert [m.body for m in got] == [f"m{i}".encode() for i in range(40)]
        assert _states(db) == {0: 10, 3: 40}
        ((lo, hi),) = rows(db, "SELECT lo, hi FROM fairq_runs")
        assert (lo, hi) == (int(got[0].id, 16), int(got[-1].id, 16))
        assert rows(
            db,
            "SELECT count(*) FROM fairq_messages INDEXED BY fairq_ix_waiting "
            "WHERE state = 1 AND avail_at >= 0",
        ) == [(0,)]
        more = await q.receive(max_messages=40)  # never the leased ones again
        assert [m.body for m in more] == [f"m{i}".encode() for i in range(40, 50)]
        await q.ack_batch([m.receipt for m in got])
        assert _states(db) == {1: 10}  # (ten: a small receive's, leased the other way)
        s = await q.stats()  # settled: the acked run leaves nothing behind
        assert (s.visible, s.in_flight, s.acked, s.sent) == (0, 10, 40, 50), s
        assert rows(db, "SELECT * FROM fairq_runs") == []


async def test_a_lease_in_state_3_comes_back_when_it_ends(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    clock = fairq.ManualClock()
    async with await fairq.connect(f"sqlite:///{db}", clock=clock) as broker:
        q = await broker.declare_queue("q", visibility_timeout=30)
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(20)])
        got = await q.receive(max_messages=20)
        assert _states(db) == {3: 20}
        assert await broker.backend.next_due() == pytest.approx(clock.now() + 30)
        clock.advance(29.9)
        assert await q.receive(max_messages=20) == []
        clock.advance(0.2)
        again = await q.receive(max_messages=20)
        assert [m.body for m in again] == [m.body for m in got]
        assert {m.attempt for m in again} == {2}
        with pytest.raises(fairq.LeaseLost):
            await q.ack_batch([m.receipt for m in got])
        await q.ack_batch([m.receipt for m in again])
        s = await q.stats()
        assert (s.visible, s.in_flight, s.redelivered, s.acked) == (0, 0, 20, 20), s


async def test_one_message_of_a_run_takes_a_nack_an_extension_and_a_small_ack(
    tmp_path: Path,
) -> None:
    db = tmp_path / "f.db"
    clock = fairq.ManualClock()
    async with await fairq.connect(f"sqlite:///{db}", clock=clock) as broker:
        q = await broker.declare_queue("q", visibility_timeout=30)
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(32)])
        got = await q.receive(max_messages=32)
        await got[0].nack(delay=0)  # back at once, alone
        await got[1].extend(100)
        await q.ack_batch([m.receipt for m in got[2:7]])  # a small ack: marked, settled later
        (back,) = await q.receive(max_messages=5)
        assert (back.body, back.attempt) == (b"m0", 2)
        await back.ack()
        await q.ack_batch([m.receipt for m in got[7:]])  # the rest of the run
        clock.advance(31)
        assert await q.receive(max_messages=5) == []  # m1's lease was extended
        clock.advance(70)
        (late,) = await q.receive(max_messages=5)
        assert late.body == b"m1"
        await late.ack()
        s = await q.stats()
        assert (s.visible, s.in_flight, s.acked, s.depth) == (0, 0, 32, 0), s
        assert rows(db, "SELECT count(*) FROM fairq_messages") == [(0,)]


async def test_runs_a_process_left_are_settled_by_the_next(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    clock = fairq.ManualClock()
    url = f"sqlite:///{db}"
    first = await fairq.connect(url, clock=clock)
    q = await first.declare_queue("q", visibility_timeout=30)
    await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(20)])
    await q.receive(max_messages=20)
    await first.close()  # (as after a crash: the run and its rows stay as they are)
    assert _states(db) == {3: 20} and len(rows(db, "SELECT * FROM fairq_runs")) == 1
    async with await fairq.connect(url, clock=clock) as second:
        q2 = second.queue("q")
        s = await q2.stats()
        assert (s.visible, s.in_flight) == (0, 20), s
        assert _states(db) == {1: 20} and rows(db, "SELECT * FROM fairq_runs") == []
        assert await q2.receive(max_messages=20) == []
        clock.advance(31)
        again = await q2.receive(max_messages=20)
        assert len(again) == 20 and {m.attempt for m in again} == {2}


async def test_a_fifo_queue_and_a_receive_across_a_hole_lease_the_other_way(
    tmp_path: Path,
) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}", clock=fairq.ManualClock()) as broker:
        fifo = await broker.declare_queue("f", fifo=True)
        await fifo.send_batch([fairq.Outgoing(f"m{i}", group=f"g{i}") for i in range(20)])
        assert len(await fifo.receive(max_messages=20)) == 20
        plain = await broker.declare_queue("p")
        await plain.send_batch([fairq.Outgoing(f"m{i}") for i in range(20)])
        await fifo.send(b"between", group="g")  # an id of another queue inside plain's
        await plain.send_batch([fairq.Outgoing(f"n{i}") for i in range(20)])
        got = await plain.receive(max_messages=40)
        assert len(got) == 40
        assert rows(db, "SELECT count(*) FROM fairq_messages WHERE state = 3") == [(0,)]
        assert rows(db, "SELECT * FROM fairq_runs") == []
