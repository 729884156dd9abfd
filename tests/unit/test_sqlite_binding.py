"""How the SQLite backend binds a send's columns (backends/sqlite/messages.py): a message
without attributes is inserted by a statement that leaves ``attrs`` to its default (NULL),
and bodies are bound as ``bytearray``, both to skip Python's sqlite3 adapter lookup. What is
stored must not change: a BLOB body (an empty one too, not NULL) and NULL attributes, read
back as the same ``bytes`` and ``{}``, alone, in a batch, and mixed with attributes."""

from __future__ import annotations

from pathlib import Path

import fairq
from sqlite_files import rows

BODIES = [b"", b"\x00\xff binary \x00", b"x" * 5000]


async def test_one_message_sends_store_blobs_and_null_attributes(tmp_path: Path) -> None:
    db = tmp_path / "b.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("jobs")
        ids = [await q.send(b) for b in BODIES]
        ids.append(await q.send(b"with", attributes={"k": "v"}))
        stored = rows(
            db,
            "SELECT typeof(body), length(body), attrs FROM fairq_inbox UNION ALL "
            "SELECT typeof(body), length(body), attrs FROM fairq_messages",
        )
        assert sorted(stored, key=str) == sorted(
            [
                ("blob", 0, None),
                ("blob", 11, None),
                ("blob", 5000, None),
                ("blob", 4, b'{"k":"v"}'),
            ],
            key=str,
        )
        got = await q.receive(max_messages=10)
    assert [(m.id, m.body, m.attributes) for m in got] == [
        *((i, b, {}) for i, b in zip(ids, BODIES, strict=False)),
        (ids[3], b"with", {"k": "v"}),
    ]
    assert all(type(m.body) is bytes for m in got)


async def test_batches_with_and_without_attributes_store_the_same(tmp_path: Path) -> None:
    db = tmp_path / "b.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("jobs")
        plain = await q.send_batch([fairq.Outgoing(b) for b in BODIES * 20])  # 60 rows
        mixed = await q.send_batch(
            [
                fairq.Outgoing(b"a", attributes={"n": str(i)}) if i % 2 else fairq.Outgoing(b"")
                for i in range(40)
            ]
        )
        assert rows(db, "SELECT count(*) FROM fairq_messages WHERE typeof(body) != 'blob'") == [
            (0,)
        ]
        assert rows(db, "SELECT count(*) FROM fairq_messages WHERE attrs IS NULL") == [(80,)]
        got = await q.receive(max_messages=100)
    assert [m.id for m in got] == plain + mixed
    assert [m.body for m in got] == BODIES * 20 + [b"a" if i % 2 else b"" for i in range(40)]
    assert [m.attributes for m in got[60:]] == [{"n": str(i)} if i % 2 else {} for i in range(40)]
    assert all(type(m.body) is bytes for m in got)
