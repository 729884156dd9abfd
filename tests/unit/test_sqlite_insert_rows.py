"""``txn.insert_rows``: an INSERT of many rows as multi-row statements of 32 rows and
``executemany`` for the rest — every row stored once, in order, whatever the count; and a
batch send goes through it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import fairq
from fairq.backends.sqlite import txn


@pytest.mark.parametrize("n", [0, 1, 2, 31, 32, 33, 64, 100, 1000])
def test_every_row_is_inserted_once_in_order(n: int) -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, a, b, c)")
    rows = [(i, f"a{i}", i * 0.5, None if i % 3 else b"x") for i in range(n)]
    txn.insert_rows(conn, "INSERT INTO t (id, a, b, c) VALUES (?, ?, ?, ?)", rows)
    assert conn.execute("SELECT id, a, b, c FROM t ORDER BY id").fetchall() == rows


def test_constants_in_the_values_are_kept_for_every_row() -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k, v)")
    txn.insert_rows(conn, "INSERT INTO t (id, k, v) VALUES (?, 7, ?)", [(i, i) for i in range(40)])
    assert conn.execute("SELECT count(*), min(k), max(k), sum(v) FROM t").fetchone() == (
        40,
        7,
        7,
        sum(range(40)),
    )


def test_a_failing_row_inserts_nothing_of_its_statement() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v)")
    conn.execute("INSERT INTO t VALUES (40, 'taken')")
    conn.execute("BEGIN")
    with pytest.raises(sqlite3.IntegrityError):
        txn.insert_rows(conn, "INSERT INTO t (id, v) VALUES (?, ?)", [(i, i) for i in range(64)])
    conn.execute("ROLLBACK")
    assert conn.execute("SELECT id, v FROM t").fetchall() == [(40, "taken")]


async def test_a_batch_send_stores_every_message(tmp_path: Path) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'f.db'}") as broker:
        q = await broker.declare_queue("q")
        ids = await q.send_batch([fairq.Outgoing(f"m{i}", {"i": str(i)}) for i in range(70)])
        got = await q.receive(max_messages=100)
        assert [m.id for m in got] == ids
        assert [(m.body, m.attributes) for m in got] == [
            (f"m{i}".encode(), {"i": str(i)}) for i in range(70)
        ]
