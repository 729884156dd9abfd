"""SQLite: a due time that only a write transaction moves on (a lease of a process that
died, or a row acked elsewhere and not settled yet) must not make an idle process's
wake-up pulse spin: an attention taker only reads, so the pulse sweeps once itself."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import fairq


async def _idle_looks(url: str, ack: bool) -> tuple[int, float]:
    async with await fairq.connect(url) as a, await fairq.connect(url) as b:
        domain = await b.declare_attention("dom")
        q = await a.declare_queue("jobs")
        await q.send(b"x")
        (m,) = await q.receive(visibility_timeout=0.3)
        if ack:
            await m.ack()  # a small ack: the row keeps its lease's end until settled
        await asyncio.sleep(0.4)  # that end passes, and nobody writes
        backend = b.backend
        looks = 0
        original = backend.next_due

        async def counted(*args: Any) -> float | None:
            nonlocal looks
            looks += 1
            return await original(*args)

        backend.next_due = counted  # type: ignore[method-assign]
        cpu = time.process_time()
        assert await domain._take(wait=1.5) is None
        return looks, time.process_time() - cpu


async def test_an_acked_row_left_unsettled_does_not_spin_an_idle_taker(tmp_path: Path) -> None:
    looks, cpu = await _idle_looks(f"sqlite:///{tmp_path / 'f.db'}", ack=True)
    assert looks < 50, looks  # thousands while it spun
    assert cpu < 0.5, cpu


async def test_a_lapsed_lease_does_not_spin_an_idle_taker(tmp_path: Path) -> None:
    looks, cpu = await _idle_looks(f"sqlite:///{tmp_path / 'f.db'}", ack=False)
    assert looks < 50, looks
    assert cpu < 0.5, cpu
