"""SQLite message ids: never handed out twice, though the last one is not written on
every send (``txn.Store``): a deleted message's id must not come back, in this process or
in another one on the same file, even when the clock has not moved."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import fairq


def _saved_last_id(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        (value,) = conn.execute("SELECT value FROM fairq_meta WHERE key = 'last_id'").fetchone()
        return int(value)
    finally:
        conn.close()


async def test_a_send_does_not_write_the_last_id(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("q")
        before = _saved_last_id(db)
        for _ in range(5):
            await q.send(b"x")
        assert _saved_last_id(db) == before  # one page fewer per commit


async def test_ids_of_acked_messages_never_come_back(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    clock = fairq.ManualClock()  # frozen: every id falls in the same millisecond
    url = f"sqlite:///{db}"
    seen: set[str] = set()
    async with (
        await fairq.connect(url, clock=clock) as a,
        await fairq.connect(url, clock=clock) as b,
    ):
        qa = await a.declare_queue("q")
        qb = b.queue("q")
        for i in range(6):
            q = qa if i % 2 else qb  # the other connection committed in between
            mid = await q.send(b"x")
            assert mid not in seen
            seen.add(mid)
            (m,) = await q.receive()
            await m.ack()  # the queue is empty again: no row remembers the id
    async with await fairq.connect(url, clock=clock) as c:  # a reopened file too
        mid = await c.queue("q").send(b"x")
        assert mid not in seen and mid > max(seen)


async def test_purge_remembers_the_ids_it_deletes(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    clock = fairq.ManualClock()
    url = f"sqlite:///{db}"
    async with await fairq.connect(url, clock=clock) as a:
        q = await a.declare_queue("q")
        last = (await q.send_batch([fairq.Outgoing(b"x")] * 3))[-1]
        await q.purge()
    async with await fairq.connect(url, clock=clock) as b:
        assert await b.queue("q").send(b"y") > last


async def test_an_id_deleted_after_another_connection_committed_does_not_come_back(
    tmp_path: Path,
) -> None:
    """The connection that deletes the greatest id may not know it is the greatest (another
    connection committed since): the id is remembered all the same."""
    url = f"sqlite:///{tmp_path / 'f.db'}"
    clock = fairq.ManualClock()  # frozen: every id falls in the same millisecond
    async with (
        await fairq.connect(url, clock=clock) as a,
        await fairq.connect(url, clock=clock) as b,
    ):
        for fifo in (True, False):  # deleted by the ack, or settled later
            q = await a.declare_queue(f"q{fifo}", fifo=fifo)
            mid = await q.send(b"x", group="g" if fifo else None)
            (m,) = await q.receive()
            await b.declare_queue(f"other{fifo}")  # a commit a has not seen
            await m.ack()
            await q.stats()
            assert await b.queue(f"other{fifo}").send(b"y") > mid
            assert await q.send(b"z", group="g" if fifo else None) > mid
