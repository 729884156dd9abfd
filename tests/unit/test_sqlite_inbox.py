"""SQLite's inbox (schema.sql, version 12): a one-message send appends to a table with no
index, and whatever does more than send moves it into fairq_messages first. Nothing may
tell the difference: ids stay unique across processes, another process receives, counts
and ages the messages, the inbox stays small, and a file of schema 11 is upgraded."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import fairq
from fairq.backends.sqlite import writer


def _count(db: Path, table: str) -> int:
    conn = sqlite3.connect(db)
    try:
        (n,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        return int(n)
    finally:
        conn.close()


async def test_a_single_send_lands_in_the_inbox_and_a_receive_moves_it(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("q")
        ids = [await q.send(f"m{i}".encode()) for i in range(3)]
        assert _count(db, "fairq_inbox") == 3
        assert _count(db, "fairq_messages") == 0
        got = await q.receive(max_messages=10)
        assert [m.id for m in got] == ids  # in send order
        assert _count(db, "fairq_inbox") == 0
        # a batch, a delayed or a prioritised message goes straight to fairq_messages
        await q.send_batch([fairq.Outgoing(b"a"), fairq.Outgoing(b"b")])
        await q.send(b"later", delay=5)
        assert _count(db, "fairq_inbox") == 0


async def test_a_producer_alone_keeps_the_inbox_small(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    n = writer._INBOX_ROWS * 3 + 7
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("q")
        for i in range(n):
            await q.send(str(i).encode())
        assert _count(db, "fairq_inbox") <= writer._INBOX_ROWS
        s = await q.stats()
        assert (s.visible, s.sent) == (n, n)
        got = await q.receive(max_messages=1000)
        assert [m.body for m in got] == [str(i).encode() for i in range(n)]


async def test_another_process_receives_counts_and_ages_inbox_messages(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    clock = fairq.ManualClock()
    async with (
        await fairq.connect(url, clock=clock) as a,
        await fairq.connect(url, clock=clock) as b,
    ):
        qa = await a.declare_queue("q")
        qb = b.queue("q")
        first = await qa.send(b"one")
        clock.advance(3)
        await qa.send(b"two")
        s = await qb.stats()
        assert (s.visible, s.sent, s.oldest_age) == (2, 2, 3.0)
        assert len(await qb.peek(10)) == 2 and (await qb.peek(1))[0].id == first
        (m,) = await qb.receive()
        assert (m.id, m.body) == (first, b"one")
        await m.ack()
        assert await qb.purge() == 1  # the other one, wherever it was
        assert (await qa.stats()).visible == 0


async def test_a_waiting_receiver_in_another_process_gets_an_inbox_send(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    async with await fairq.connect(url) as a, await fairq.connect(url) as b:
        qa = await a.declare_queue("q")
        qb = b.queue("q")
        assert await qb.receive() == []  # b now looks without the write lock first
        waiting = asyncio.create_task(qb.receive(wait=5))
        await asyncio.sleep(0.05)
        mid = await qa.send(b"x")
        (m,) = await asyncio.wait_for(waiting, 5)
        assert m.id == mid
        assert await qb.receive() == []


async def test_ids_stay_unique_across_processes_in_one_millisecond(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    clock = fairq.ManualClock()  # frozen: every id falls in the same millisecond
    async with (
        await fairq.connect(url, clock=clock) as a,
        await fairq.connect(url, clock=clock) as b,
    ):
        qa = await a.declare_queue("q")
        qb = b.queue("q")
        ids = [await (qa if i % 2 else qb).send(b"x") for i in range(10)]  # all in the inbox
        assert len(set(ids)) == 10 and ids == sorted(ids)
        got = await qa.receive(max_messages=10)
        assert [m.id for m in got] == ids


async def test_a_schema_11_file_is_upgraded(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        old = [fairq.Outgoing(b"old"), fairq.Outgoing(b"older")]
        await (await broker.declare_queue("q")).send_batch(old)  # stored in fairq_messages
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE fairq_inbox")
    conn.execute("UPDATE fairq_meta SET value = 11 WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = broker.queue("q")
        await q.send(b"new")
        assert [m.body for m in await q.receive(max_messages=5)] == [b"old", b"older", b"new"]
