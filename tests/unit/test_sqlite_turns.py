"""The SQLite writers' turns (``backends/sqlite/turns.py``): a waiter's announcement is
seen by the others, taken back when its turn is over, and a writer that sees one yields
its next transaction — for at most ``YIELD_MAX`` when the waiter never takes its turn."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

import fairq
from fairq.backends.sqlite.turns import YIELD_MAX, Turns

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="turns need flock")


def test_an_announcement_is_seen_by_the_others_until_it_is_taken_back(tmp_path: Path) -> None:
    db = str(tmp_path / "t.db")
    a, b, c = Turns.open(db), Turns.open(db), Turns.open(db)
    assert a is not None and b is not None and c is not None
    assert not a.others_wait() and not b.others_wait()
    a.announce()
    b.announce()  # two waiters at once
    assert a.waiting and b.waiting and c.others_wait()
    a.done()
    assert not a.waiting and c.others_wait() and a.others_wait()  # b still waits
    b.close()  # a closed (or dead) waiter's lock goes with it
    assert not c.others_wait()
    a.close()
    c.close()


def test_no_turns_without_a_file(tmp_path: Path) -> None:
    assert Turns.open(str(tmp_path / "missing-dir" / "t.db")) is None
    assert Turns.open(":memory:") is None


async def test_a_writer_yields_to_a_waiter_but_not_for_long(tmp_path: Path) -> None:
    db = tmp_path / "y.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("q")
        writer = broker.backend._writer  # type: ignore[attr-defined]
        await q.send(b"first")
        assert writer.yields == 0, "nobody waits: no yield"
        stalled = Turns.open(str(db))
        assert stalled is not None
        stalled.announce()  # a waiter that never takes its turn
        try:
            await q.send(b"seen")  # commits, then sees the waiter
            assert writer.yields == 1
            t0 = time.monotonic()
            await q.send(b"after the yield")  # waits out the yield, no longer
            assert writer.yields == 2
            assert time.monotonic() - t0 >= YIELD_MAX * 0.9
        finally:
            stalled.close()
        await q.send(b"free again")
        assert writer.yields == 2
        assert len(await q.receive(max_messages=10)) == 4


def test_looking_takes_no_lock_until_someone_has_announced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    db = str(tmp_path / "f.db")
    looker, waiter = Turns.open(db), Turns.open(db)
    assert looker is not None and waiter is not None
    calls: list[int] = []
    real = fcntl.flock

    def counted(fd: int, op: int) -> None:
        calls.append(op)
        real(fd, op)

    monkeypatch.setattr(fcntl, "flock", counted)
    assert not looker.others_wait() and not looker.others_wait()
    assert calls == [], "nobody announced: no system call"
    waiter.announce()
    assert looker.others_wait() and looker.others_wait(), "seen at every look while it waits"
    waiter.done()
    calls.clear()
    assert not looker.others_wait()  # one locked look finds nobody and clears the byte
    assert len(calls) == 2
    calls.clear()
    assert not looker.others_wait() and calls == []
    waiter.announce()  # a new wait after the byte was cleared is seen again
    assert looker.others_wait()
    waiter.close()
    looker.close()
