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


async def test_a_send_beside_delete_queue_does_not_outlive_its_queue(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("orders")
        # one pass of the loop: one transaction, the send first
        await asyncio.gather(q.send(b"for orders"), broker.delete_queue("orders"))
        other = await broker.declare_queue("payments")  # may take the deleted queue's id
        assert await other.receive(max_messages=10) == []
        s = await other.stats()
        assert (s.sent, s.visible) == (0, 0)
    assert _count(db, "fairq_inbox") == _count(db, "fairq_messages") == 0


async def test_an_inbox_row_of_a_deleted_queue_is_dropped(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    url = f"sqlite:///{db}"
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("q")
        await q.send(b"kept")
        conn = sqlite3.connect(db)
        (top,) = conn.execute("SELECT max(id) FROM fairq_inbox").fetchone()
        conn.execute(  # as a fairq that deleted the queue without draining would leave it
            "INSERT INTO fairq_inbox (id, queue_id, avail_at, body) VALUES (?, 999, 0, x'00')",
            (top + 1,),
        )
        conn.commit()
        conn.close()
        assert [m.body for m in await q.receive(max_messages=5)] == [b"kept"]
        assert _count(db, "fairq_inbox") == 0
        assert _count(db, "fairq_messages") == 1
        later = await q.send(b"later")
        assert int(later, 16) > top + 1  # the dropped row's id does not come back


async def test_an_inbox_id_taken_by_an_older_fairq_moves_under_a_new_id(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("q")
        mid = await q.send(b"from the inbox")
        conn = sqlite3.connect(db)
        conn.execute(  # a process of schema 11 (no look at the inbox) handed the same id out
            "INSERT INTO fairq_messages (id, queue_id, state, priority, avail_at, attempt, body) "
            "SELECT id, queue_id, 0, 0, avail_at, 0, x'6f6c646572' FROM fairq_inbox"
        )
        conn.commit()
        conn.close()
        got = await q.receive(max_messages=5)  # moved, not refused
        assert sorted(m.body for m in got) == [b"from the inbox", b"older"]
        assert len({m.id for m in got}) == 2 and mid in {m.id for m in got}
        assert _count(db, "fairq_inbox") == 0


async def test_the_new_formats_wait_after_an_upgrade(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    url = f"sqlite:///{db}"
    async with await fairq.connect(url) as broker:
        await broker.declare_queue("q")
    conn = sqlite3.connect(db)
    conn.execute("UPDATE fairq_meta SET value = 11 WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    # a process of schema 11 may still write for half a second: while it can, no inbox row
    # (it would hand their ids out again) and no ACKED_LEASE row (it would revive it)
    async with await fairq.connect(url) as broker:
        q = broker.queue("q")
        await q.send(b"x")
        assert _count(db, "fairq_inbox") == 0
        (m,) = await q.receive()
        await m.ack()
        conn = sqlite3.connect(db)
        assert conn.execute("SELECT lease, avail_at FROM fairq_messages").fetchall() == [
            (None, -0.5)
        ]
        conn.execute("UPDATE fairq_meta SET value = 0 WHERE key = 'formats_from'")
        conn.commit()
        conn.close()
    async with await fairq.connect(url) as broker:  # once the time has come
        q = broker.queue("q")
        await q.send(b"y")
        assert _count(db, "fairq_inbox") == 1
