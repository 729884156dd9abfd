"""The SQLite ``page_size`` URL option: it sets the page size of a file the connection
creates, an existing file keeps its own (with a warning), and a bad value is refused
before anything is opened."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

import fairq


def _page_size(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        (size,) = conn.execute("PRAGMA page_size").fetchone()
        return int(size)
    finally:
        conn.close()


async def test_a_new_file_gets_the_page_size_and_works(tmp_path: Path) -> None:
    db = tmp_path / "small.db"
    async with await fairq.connect(f"sqlite:///{db}?page_size=1024") as broker:
        q = await broker.declare_queue("work")
        await q.send_batch([fairq.Outgoing(b"x" * 3000) for _ in range(50)])  # overflow pages
        got = await q.receive(max_messages=50)
        assert [m.body for m in got] == [b"x" * 3000] * 50
        await q.ack_batch([m.receipt for m in got])
        assert (await q.stats()).depth == 0
    assert _page_size(db) == 1024


async def test_an_existing_file_keeps_its_page_size(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "old.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        await (await broker.declare_queue("work")).send(b"kept")
    caplog.set_level(logging.WARNING, logger="fairq.sqlite")
    async with await fairq.connect(f"sqlite:///{db}?page_size=2048") as broker:
        got = await broker.queue("work").receive()
        assert [m.body for m in got] == [b"kept"]
    assert _page_size(db) == 4096
    assert "keeps the page size it was created with (4096 bytes, not 2048)" in caplog.text


@pytest.mark.parametrize("value", ["1000", "256", "131072", "big", "-1024"])
async def test_a_bad_page_size_is_refused(tmp_path: Path, value: str) -> None:
    db = tmp_path / "never.db"
    with pytest.raises(fairq.InvalidOption, match="page_size must be a power of two"):
        await fairq.connect(f"sqlite:///{db}?page_size={value}")
    assert not db.exists()
