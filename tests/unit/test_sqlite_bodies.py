"""SQLite: the copies of one publish share one stored body, counted, and the body goes
when the last copy does — whichever way it goes (ack, dead letter, purge, delete)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import fairq


def bodies(db: Path) -> list[tuple[int, int]]:
    conn = sqlite3.connect(db)
    try:
        return [(len(b), n) for b, n in conn.execute("SELECT body, refs FROM fairq_bodies")]
    finally:
        conn.close()


async def test_copies_share_a_body_until_the_last_one_goes(tmp_path: Path) -> None:
    db = tmp_path / "b.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        t = await broker.declare_topic("t")
        subs = [await t.subscribe(f"s{i}", max_attempts=1) for i in range(4)]
        only = await broker.declare_topic("solo")
        solo = await only.subscribe("one")
        await t.publish(b"x" * 1000)
        await only.publish(b"y" * 1000)  # one copy: stored inline, nothing shared
        assert bodies(db) == [(1000, 4)]
        (m,) = await subs[0].receive()
        assert m.body == b"x" * 1000
        await m.ack()  # an acked row is deleted (and its body released) when settled:
        assert bodies(db) == [(1000, 4)]
        await subs[0].stats()  # before anything reads the queue's counters
        assert bodies(db) == [(1000, 3)]
        (m,) = await subs[1].receive()
        await m.nack()  # last attempt: dead-lettered, the DLQ copy keeps the body inline
        (dead,) = await broker.queue("t.s1.dlq").receive()
        assert dead.body == b"x" * 1000
        assert bodies(db) == [(1000, 2)]
        await subs[2].purge()
        assert bodies(db) == [(1000, 1)]
        assert [m.body for m in await subs[3].peek()] == [b"x" * 1000]
        await broker.delete_queue("t.s3")
        assert bodies(db) == []
        (m,) = await solo.receive()
        assert m.body == b"y" * 1000


async def test_shared_bodies_survive_reopen_and_redrive(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    async with await fairq.connect(url) as broker:
        t = await broker.declare_topic("t")
        for i in range(2):
            await t.subscribe(f"s{i}", max_attempts=1)
        await t.publish_batch([fairq.Outgoing(f"m{i}") for i in range(10)])
    async with await fairq.connect(url) as broker:
        q = broker.queue("t.s0")
        for m in await q.receive(max_messages=10):
            await m.nack()
        assert await broker.redrive("t.s0.dlq") == 10
        got = sorted(m.body for m in await q.receive(max_messages=20))
        assert got == sorted(f"m{i}".encode() for i in range(10))
        other = sorted(m.body for m in await broker.queue("t.s1").receive(max_messages=20))
        assert other == got


async def test_a_file_without_body_ref_gets_the_column(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        await (await broker.declare_queue("q")).send(b"old message")
    conn = sqlite3.connect(db)  # what a version-5 file looks like
    conn.execute("ALTER TABLE fairq_messages DROP COLUMN body_ref")
    conn.execute("DROP TABLE fairq_bodies")
    conn.execute("UPDATE fairq_meta SET value = 5 WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        (m,) = await broker.queue("q").receive()
        assert m.body == b"old message"
        t = await broker.declare_topic("t")
        for name in ("a", "b"):
            await t.subscribe(name)
        await t.publish(b"shared")
        assert (await broker.queue("t.a").receive())[0].body == b"shared"
    assert bodies(db) == [(6, 2)]
