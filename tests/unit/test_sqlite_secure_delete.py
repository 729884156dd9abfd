"""The SQLite ``secure_delete`` URL option: ``fast`` by default (a deleted message is
zeroed on the pages its commit writes anyway), ``on`` (also on pages freed whole: no acked
body is left in the file), ``off``; anything else is refused before anything is opened."""

from __future__ import annotations

from pathlib import Path

import pytest

import fairq
from fairq.backends.sqlite import SQLiteBackend


def _pragma(broker: fairq.Broker) -> int:
    backend = broker.backend
    assert isinstance(backend, SQLiteBackend)
    conn = backend._writer.conn
    assert conn is not None
    (value,) = conn.execute("PRAGMA secure_delete").fetchone()
    return int(value)


@pytest.mark.parametrize(
    ("option", "value"),
    [("", 2), ("?secure_delete=fast", 2), ("?secure_delete=ON", 1), ("?secure_delete=off", 0)],
)
async def test_the_option_sets_the_pragma(tmp_path: Path, option: str, value: int) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'q.db'}{option}") as broker:
        q = await broker.declare_queue("work")
        await q.send(b"x")
        assert _pragma(broker) == value


async def test_on_leaves_no_acked_body_in_the_file(tmp_path: Path) -> None:
    db = tmp_path / "on.db"
    async with await fairq.connect(f"sqlite:///{db}?secure_delete=on") as broker:
        q = await broker.declare_queue("work")
        await q.send_batch([fairq.Outgoing(b"SECRET-%05d-" % i * 20) for i in range(300)])
        while got := await q.receive(max_messages=100):
            await q.ack_batch([m.receipt for m in got])
        assert (await q.stats()).depth == 0
    assert not (tmp_path / "on.db-wal").exists() or not (tmp_path / "on.db-wal").stat().st_size
    assert b"SECRET-" not in db.read_bytes()


@pytest.mark.parametrize("value", ["yes", "2", "full"])
async def test_a_bad_value_is_refused(tmp_path: Path, value: str) -> None:
    db = tmp_path / "never.db"
    with pytest.raises(fairq.InvalidOption, match="secure_delete must be on, fast or off"):
        await fairq.connect(f"sqlite:///{db}?secure_delete={value}")
    assert not db.exists()
