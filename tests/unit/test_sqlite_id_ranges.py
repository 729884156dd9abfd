"""A big receive's lease and a big ack's delete name their rows by a range (``id BETWEEN``)
when the ids are one run lo..hi, each once, and by a list otherwise (backends/sqlite/txn.py's
``ids_in``). The range must name exactly the rows the list would: a row of another queue or
of another lease inside the run, a hole, a repeated receipt all keep the list's results."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import fairq
from fairq.backends.sqlite.txn import SPAN_FROM, ids_in

SQL = "DELETE FROM t WHERE id IN ({marks}) AND lease = ?"


def test_a_run_of_ids_is_a_range_and_anything_else_a_list() -> None:
    run = list(range(100, 100 + SPAN_FROM))
    assert ids_in(SQL, run) == ("DELETE FROM t WHERE id BETWEEN ? AND ? AND lease = ?", (100, 115))
    assert ids_in(SQL, run[::-1])[1] == (100, 115)  # (the order does not matter)
    swapped = [*run[:5], run[6], run[5], *run[7:]]
    assert ids_in(SQL, swapped)[1] == (100, 115)
    assert ids_in(SQL, tuple(run))[1] == (100, 115)  # (a tuple, as an ack's parse gives)
    holed = [*run[:-1], 200]
    repeated = [*run[:-1], 100]
    short = run[: SPAN_FROM - 1]
    for ids in (holed, repeated, short):
        sql, params = ids_in(SQL, ids)
        assert sql == f"DELETE FROM t WHERE id IN ({','.join('?' * len(ids))}) AND lease = ?"
        assert params == ids


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[fairq.Broker]:
    b = await fairq.connect(f"sqlite:///{tmp_path / 'r.db'}")
    yield b
    await b.close()


async def test_interleaved_queues_receive_and_ack_their_own_rows(broker: fairq.Broker) -> None:
    a = await broker.declare_queue("a")
    b = await broker.declare_queue("b")
    for i in range(60):  # ids alternate between the queues: no run within one queue
        await (a if i % 2 else b).send_batch([fairq.Outgoing(f"{i}".encode())])
    got_a = await a.receive(max_messages=30)
    got_b = await b.receive(max_messages=30)
    assert len(got_a) == len(got_b) == 30
    await a.ack_batch([m.receipt for m in got_a])
    assert (await b.stats()).in_flight == 30
    await b.ack_batch([m.receipt for m in got_b])
    for q in (a, b):
        s = await q.stats()
        assert (s.visible, s.in_flight, s.acked) == (0, 0, 30)


async def test_a_run_with_a_lost_lease_inside_acks_the_others(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("jobs")
    await q.send_batch([fairq.Outgoing(b"x") for _ in range(40)])
    got = await q.receive(max_messages=40, visibility_timeout=30)
    assert len(got) == 40
    await got[17].nack()  # its lease ends: one id of the run is no longer this lease's
    again = await q.receive(max_messages=1)
    assert [m.id for m in again] == [got[17].id]
    with pytest.raises(fairq.LeaseLost) as lost:
        await q.ack_batch([m.receipt for m in got])
    assert lost.value.lost == [got[17].receipt]
    s = await q.stats()
    assert (s.in_flight, s.acked) == (1, 39)
    await again[0].ack()
    assert (await q.stats()).acked == 40


async def test_a_receive_across_a_hole_leases_only_what_it_read(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("jobs")
    await q.send_batch([fairq.Outgoing(b"x") for _ in range(50)])
    first = await q.receive(max_messages=1)  # a hole at the head, leased to someone else
    rest = await q.receive(max_messages=20)
    assert first[0].id not in {m.id for m in rest}
    assert (await q.stats()).in_flight == 21
    await q.ack_batch([m.receipt for m in rest])
    s = await q.stats()
    assert (s.visible, s.in_flight, s.acked) == (29, 1, 20)
    await first[0].ack()
