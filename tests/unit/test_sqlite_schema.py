"""The SQLite file: WAL mode, the recorded schema version, and a newer file refused."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

import fairq
from fairq.backends.sqlite.txn import SCHEMA_VERSION


async def test_new_file_is_wal_with_a_schema_version(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        await broker.declare_queue("q")
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    row = conn.execute("SELECT value FROM fairq_meta WHERE key = 'schema_version'").fetchone()
    assert row == (SCHEMA_VERSION,)
    conn.close()


async def test_reopening_keeps_the_schema(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    for _ in range(3):
        async with await fairq.connect(url) as broker:
            await broker.declare_queue("q")
    async with await fairq.connect(url) as broker:
        assert await broker.list_queues() == ["q", "q.dlq"]


async def test_a_file_from_a_newer_fairq_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with await fairq.connect(f"sqlite:///{db}"):
        pass
    conn = sqlite3.connect(db)
    conn.execute("UPDATE fairq_meta SET value = 99 WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(fairq.ConnectionError, match="newer fairq"):
        await fairq.connect(f"sqlite:///{db}")


async def test_a_process_running_when_a_newer_fairq_upgrades_the_file_stops_writing(
    tmp_path: Path,
) -> None:
    """A rolling upgrade: a newer fairq migrates the file while this process runs. This one
    would misread rows of the newer schema (a schema-9 process delivered again messages a
    schema-11 one had acked), so within a second its writes stop with an error that says
    why; a Worker exits, for its supervisor to start the new version."""
    db = tmp_path / "rolling.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("q")
        await q.send(b"before")
        newer = sqlite3.connect(db)  # what a newer fairq's migration leaves
        newer.execute("UPDATE fairq_meta SET value = 99 WHERE key = 'schema_version'")
        newer.commit()
        newer.close()
        await asyncio.sleep(1.1)
        with pytest.raises(fairq.BackendError, match="upgraded by a newer fairq"):
            await q.send(b"after")
        with pytest.raises(fairq.BackendError, match="restart it with the newer fairq"):
            await q.receive()


@pytest.mark.parametrize("query", ["synchronous=sometimes", "busy_timeout=soon", "colour=blue"])
async def test_bad_url_options(tmp_path: Path, query: str) -> None:
    with pytest.raises(fairq.InvalidOption):
        await fairq.connect(f"sqlite:///{tmp_path / 'f.db'}?{query}")


async def test_synchronous_full(tmp_path: Path) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'f.db'}?synchronous=full") as b:
        q = await b.declare_queue("q")
        await q.send(b"x")
        assert b.backend._writer.conn.execute("PRAGMA synchronous").fetchone() == (2,)  # type: ignore[attr-defined]


async def test_a_version_1_file_is_upgraded(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("kept")
        await q.send(b"from version 1")
    conn = sqlite3.connect(db)  # make it what fairq 0.1 (schema 1) wrote
    for table in ("fairq_topics", "fairq_subscriptions", "fairq_topic_dedup"):
        conn.execute(f"DROP TABLE {table}")
    for table in ("fairq_idempotency", "fairq_versions"):  # version 3
        conn.execute(f"DROP TABLE {table}")
    for table in ("fairq_rooms", "fairq_room_fans", "fairq_room_steps", "fairq_room_used"):
        conn.execute(f"DROP TABLE {table}")  # version 5
    conn.execute("UPDATE fairq_meta SET value = 1 WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        (m,) = await broker.queue("kept").receive()
        assert m.body == b"from version 1"
        t = await broker.declare_topic("new-in-2")
        await t.subscribe("s")
        assert (await t.publish(b"x")).subscriptions == ["s"]
        assert await broker.idempotency("new-in-3", ttl=60).claim("k") is not None
        assert await broker.versions("new-in-3").advance("e", 1)
        room = await broker.waiting_room("new-in-5")
        assert (await room.join("fan-1")).position == 0
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT value FROM fairq_meta WHERE key = 'schema_version'").fetchone() == (
        SCHEMA_VERSION,
    )
    conn.close()


async def test_a_version_7_file_is_upgraded_with_its_attention_domains(tmp_path: Path) -> None:
    """Version 8 schedules attention in worker time: older files gain the virtual times,
    estimates and slice charges (columns) and the usage history (a table), and keep their
    keys and signals."""
    db = tmp_path / "old.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        a = await broker.declare_attention("market", plans={"basic": fairq.Plan(1, 5, 20.0)})
        await a.set_resource("k1", tenant="t1")
        await a.publish_batch("k1", [fairq.Outgoing(b"x") for _ in range(3)])
        await a.publish("k2", b"y")
    conn = sqlite3.connect(db)  # make it what fairq wrote at schema 7
    conn.execute("DROP INDEX fairq_att_ix_vt")
    conn.execute("DROP TABLE fairq_att_usage")
    for table, column in (
        ("fairq_att_domains", "vclock"),
        ("fairq_att_domains", "estimate"),
        ("fairq_att_tenants", "vt"),
        ("fairq_att_tenants", "estimate"),
        ("fairq_att_slices", "tenant"),
        ("fairq_att_slices", "charged"),
        ("fairq_att_slices", "taken_at"),
    ):
        conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    conn.execute(
        "CREATE INDEX fairq_att_ix_turn ON fairq_att_tenants (domain_id, turn, since) "
        "WHERE ready > 0"
    )
    conn.execute("UPDATE fairq_meta SET value = 7 WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        a = broker.attention("market")
        assert (await a.stats()).signals_pending == 2
        served = []
        while (s := await a._take(0)) is not None:
            msgs, _ = await a._receive(s, 5, None)
            for m in msgs:
                await m.ack()
            await a._end(s, len(msgs), None)
            served.append((s.key, len(msgs)))
        assert sorted(served) == [("k1", 3), ("k2", 1)]
        assert {t.tenant: t.messages for t in await a.tenant_stats()} == {"t1": 3, "k2": 1}
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT value FROM fairq_meta WHERE key = 'schema_version'").fetchone() == (
        SCHEMA_VERSION,
    )
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "fairq_att_ix_vt" in indexes and "fairq_att_ix_turn" not in indexes
    conn.close()


async def test_a_version_8_file_is_upgraded_with_its_counts(tmp_path: Path) -> None:
    """Version 9 counts sends later (``fairq_queues.sent_upto``): the messages an older
    fairq stored, and counted at once, are not counted a second time."""
    db = tmp_path / "old.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("kept")
        await q.send_batch([fairq.Outgoing(b"old") for _ in range(5)])
        (m,) = await q.receive()
        await m.ack()
        before = await q.stats()  # counts everything stored so far, as schema 8 did
    assert (before.sent, before.visible, before.acked) == (5, 4, 1)
    conn = sqlite3.connect(db)  # make it what fairq wrote at schema 8
    conn.execute("ALTER TABLE fairq_queues DROP COLUMN sent_upto")
    conn.execute("UPDATE fairq_meta SET value = 8 WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = broker.queue("kept")
        s = await q.stats()
        assert (s.sent, s.visible, s.in_flight, s.acked) == (5, 4, 0, 1)
        await q.send(b"new")
        got = await q.receive(max_messages=10)
        assert len(got) == 5
        await q.ack_batch([m.receipt for m in got])
        s = await q.stats()
        assert (s.sent, s.visible, s.in_flight, s.acked) == (6, 0, 0, 6)
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT value FROM fairq_meta WHERE key = 'schema_version'").fetchone() == (
        SCHEMA_VERSION,
    )
    conn.close()
