"""SQLite's POSIX locks on the ``-shm`` file stay where SQLite put them.

A process holding a connection to a WAL database holds a read lock on the ``-shm`` file
(the "DMS" lock) that tells other processes the WAL index is in use. POSIX drops ALL of a
process's locks on a file when the process closes ANY descriptor of that file, so nothing
in fairq may open and close the ``-shm`` (a checkpointer that once read its header did:
another process then found no lock, truncated and rebuilt the index under this one, and
a process with the index mapped died of SIGBUS)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

import fairq

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/locks")


def shm_locks(db: Path) -> list[str]:
    """This process's POSIX locks on the database's ``-shm`` file."""
    inode = os.stat(f"{db}-shm").st_ino
    me = f" {os.getpid()} "
    with open("/proc/locks") as f:
        return [line for line in f if f":{inode} " in line and me in line]


async def test_the_shm_lock_survives_a_broker_at_work(tmp_path: Path) -> None:
    db = tmp_path / "locks.db"
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("work")
        assert shm_locks(db), "SQLite holds a read lock on the -shm while connected"
        for i in range(50):
            await q.send(f"m{i}")
            for m in await q.receive(max_messages=5):
                await m.ack()
        poll = asyncio.create_task(q.receive(max_messages=1, wait=5))  # the watch is on
        await asyncio.sleep(0.1)
        await q.send("last")
        assert [m.body for m in await poll] == [b"last"]
        await asyncio.sleep(0.5)  # the checkpointer thread takes several looks meanwhile
        assert shm_locks(db), "something closed a descriptor of the -shm file"
