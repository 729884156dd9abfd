"""An empty receive on SQLite is answered on the event loop's thread (no write lock): it must
still yield, so a loop polling an empty queue lets the loop's other tasks run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import fairq


async def test_polling_an_empty_queue_lets_other_tasks_run(tmp_path: Path) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'q.db'}") as broker:
        q = await broker.declare_queue("empty")
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        try:
            for _ in range(200):  # the first receive takes the lock; the rest do not
                assert await q.receive(max_messages=1) == []
        finally:
            task.cancel()
        assert ticks >= 150, f"the other task ran {ticks} times in 200 empty receives"
