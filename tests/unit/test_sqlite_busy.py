"""Another process holding SQLite's write lock longer than ``busy_timeout`` (a sqlite3
shell left inside a transaction, a process frozen while it held the lock): operations raise
``fairq.ConnectionError`` naming the lock, as for an engine out of reach, and a running
``Worker`` waits it out and goes on. It was a ``BackendError``, and every worker on the
file stopped."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

import fairq


async def test_a_lock_held_past_busy_timeout_is_an_outage_a_worker_waits_out(
    tmp_path: Path,
) -> None:
    db = tmp_path / "busy.db"
    url = f"sqlite:///{db}?busy_timeout=0.3"
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("jobs")
        handled: list[bytes] = []
        worker = fairq.Worker(broker, concurrency=2, handle_signals=False, poll_wait=0.2)

        @worker.queue("jobs")
        async def handle(msg: fairq.Received) -> None:
            handled.append(msg.body)

        running = asyncio.create_task(worker.run())
        try:
            await q.send(b"before")
            for _ in range(100):
                if handled:
                    break
                await asyncio.sleep(0.05)
            other = sqlite3.connect(db, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")  # another process's write lock, held
            try:
                with pytest.raises(fairq.ConnectionError, match="held the write lock"):
                    await q.send(b"during")
                await asyncio.sleep(1.0)  # the worker's receives meet it too
                assert not running.done(), f"the worker stopped: {running.exception()}"
            finally:
                other.execute("ROLLBACK")
                other.close()
            await q.send(b"after")
            for _ in range(100):
                if b"after" in handled:
                    break
                await asyncio.sleep(0.05)
            assert handled == [b"before", b"after"]
            assert not running.done()
        finally:
            worker.stop()
            await asyncio.wait_for(running, 10)
