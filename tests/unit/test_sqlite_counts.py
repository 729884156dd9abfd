"""SQLite counts a send later (schema 9): a send writes only its message row, and the
queue's ``sent`` and ``visible`` take it in when its rows are next deleted or its counters
read (``Txn.fold``). The counts stay exact across processes, crashes and every way a
message leaves."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

import fairq


def _url(path: Path) -> str:
    return f"sqlite:///{path}"


async def test_counts_are_exact_across_two_processes_on_one_file(tmp_path: Path) -> None:
    url = _url(tmp_path / "f.db")
    async with await fairq.connect(url) as a, await fairq.connect(url) as b:
        qa = await a.declare_queue("q")
        qb = b.queue("q")
        for i in range(5):
            await qa.send(f"m{i}")
        got = await qb.receive(max_messages=2)
        await got[0].ack()
        await qa.send("m5")  # stored after b folded the first five
        for q in (qa, qb):
            s = await q.stats()
            assert (s.sent, s.visible, s.in_flight, s.acked) == (6, 4, 1, 1), s
        rest = await qa.receive(max_messages=10)
        await qa.ack_batch([m.receipt for m in rest])
        await got[1].ack()
        for q in (qa, qb):
            s = await q.stats()
            assert (s.sent, s.visible, s.in_flight, s.acked, s.depth) == (6, 0, 0, 6, 0), s


_SENDER = """
import asyncio, os, sys
import pytest

import fairq

async def main():
    broker = await fairq.connect(sys.argv[1])
    q = await broker.declare_queue("q")
    for i in range(int(sys.argv[2])):
        await q.send(b"x")
    os._exit(0)  # no close: nothing but the file survives

asyncio.run(main())
"""


async def test_counts_survive_a_process_that_dies_after_its_sends(tmp_path: Path) -> None:
    url = _url(tmp_path / "f.db")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _SENDER, url, "7", env=env)
    assert await asyncio.wait_for(proc.wait(), 60) == 0
    async with await fairq.connect(url) as broker:
        q = broker.queue("q")
        s = await q.stats()
        assert (s.sent, s.visible) == (7, 7)
        (m,) = await q.receive()
        await m.ack()
        s = await q.stats()
        assert (s.sent, s.visible, s.acked) == (7, 6, 1)


async def test_messages_counted_later_are_counted_however_they_leave(tmp_path: Path) -> None:
    async with await fairq.connect(_url(tmp_path / "f.db")) as broker:
        q = await broker.declare_queue("q", max_length=3, overflow="drop_oldest", dead_letter=None)
        for i in range(5):  # the last two sends each drop the oldest
            await q.send(f"m{i}")
        s = await q.stats()
        assert (s.sent, s.visible, s.discarded) == (5, 3, 2), s
        await q.send("later", delay=30.0)  # drops one more; itself delayed, not visible
        s = await q.stats()
        assert (s.sent, s.visible, s.delayed, s.discarded) == (6, 2, 1, 3), s
        assert await q.purge() == 3
        await q.send("after the purge")
        s = await q.stats()
        assert (s.sent, s.visible, s.delayed, s.depth) == (7, 1, 0, 1), s

        topic = await broker.declare_topic("t")
        await topic.subscribe("a")
        await topic.subscribe("b")
        await topic.publish_batch([fairq.Outgoing(b"x"), fairq.Outgoing(b"y")])
        sub = broker.queue("t.a")
        (m,) = await sub.receive()
        await m.dead_letter("no")
        s = await sub.stats()
        assert (s.sent, s.visible, s.dead_lettered) == (2, 1, 1), s
        dlq = broker.queue("t.a.dlq")
        assert (await dlq.stats()).sent == 1
        assert await broker.redrive("t.a.dlq") == 1
        assert ((await dlq.stats()).depth, (await sub.stats()).sent) == (0, 3)


async def test_a_receive_after_an_empty_one_reads_without_the_write_lock(tmp_path: Path) -> None:
    """A long poll's retries (and an idle worker's) read whether anything is there before
    they take the write lock, so they do not take turns with a producer's commits; what
    another process sends, or what comes due, is still received."""
    url = _url(tmp_path / "f.db")
    async with await fairq.connect(url) as a, await fairq.connect(url) as b:
        qa = await a.declare_queue("q")
        qb = b.queue("q")
        writer = b.backend._writer  # type: ignore[attr-defined]
        assert await qb.receive() == []
        before = writer.commits
        for _ in range(5):
            assert await qb.receive() == []
        assert writer.commits == before, "an empty queue was polled in write transactions"
        await qa.send("from a")
        (m,) = await qb.receive()
        assert m.body == b"from a"
        await m.nack(delay=0.05)  # comes due: the read sees it due and leaves it to the sweep
        assert await qb.receive() == []
        await asyncio.sleep(0.1)
        (again,) = await qb.receive()
        assert again.id == m.id and again.attempt == 2
        with pytest.raises(fairq.QueueNotFound):
            await b.queue("never-declared").receive()
