"""What a busy worker holds (``tests/`` is on the import path): the Python memory traced
after a worker has handled ``first`` messages and after ``last``, fed the whole time so it
never runs out of work — a backend or worker that kept something of every message it
handled shows it as growth between the two."""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
from collections.abc import Awaitable, Callable

import fairq

BODY = 2000  # bytes of each message's body: let each be os.urandom(BODY), none shared
BACKLOG = 1000  # the feed keeps about this many messages ahead of the worker


async def assert_flat_while_busy(
    worker: fairq.Worker,
    route: Callable[[Callable[[fairq.Received], Awaitable[None]]], object],
    feed: Callable[[], Awaitable[int]],
    total: int,
    first: int,
    last: int,
    limit: float = 120,
) -> None:
    """Give ``worker`` a no-op handler through ``route`` (``worker.queue(name)``, ...) and
    run it while ``feed()`` (which sends some messages and says how many) keeps a backlog
    of about ``BACKLOG``, up to ``total``; the bytes traced after ``last`` messages were
    handled minus after ``first`` must stay under a fifth of the bodies handled in
    between. Memory is read between two feeds, so none of the producer's sends is in
    flight then; the worker is stopped at the end."""
    count = 0

    async def handle(msg: fairq.Received) -> None:
        nonlocal count
        count += 1

    route(handle)
    seen: list[int] = []  # bytes traced once `first`, then `last` messages were handled
    tracemalloc.start()
    task = asyncio.create_task(worker.run())
    try:
        sent = 0
        deadline = time.monotonic() + limit
        while len(seen) < 2:
            assert time.monotonic() < deadline and not task.done(), (sent, count, seen)
            if count >= (first, last)[len(seen)]:
                gc.collect()
                seen.append(tracemalloc.get_traced_memory()[0])
            elif sent < total and sent - count < BACKLOG:
                sent += await feed()
            else:
                await asyncio.sleep(0.002)
    finally:
        tracemalloc.stop()
        worker.stop()
        await asyncio.wait_for(task, 10)
    grown = seen[1] - seen[0]
    assert grown < BODY * (last - first) / 5, f"{grown} bytes more after {last - first} messages"
