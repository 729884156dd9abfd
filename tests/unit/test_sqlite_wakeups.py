"""SQLite wake-ups across connections: a long poll is woken by another connection's send
through the inotify watch on the ``-wal`` file, and the watch's descriptor is kept from
one wait to the next (closing an inotify descriptor blocks the closing thread for the
kernel's RCU grace period, 10-25 ms, and a worker stops and starts its wait every time
its queue runs empty)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

import fairq

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="inotify is Linux only")


def inotify_fds() -> int:
    """How many inotify descriptors this process holds."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify":
                n += 1
        except OSError:
            continue
    return n


async def test_waits_reuse_one_watch_and_wake_on_another_connections_send(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'wake.db'}"
    before = inotify_fds()
    async with await fairq.connect(url) as consumer, await fairq.connect(url) as producer:
        q = await consumer.declare_queue("work")
        out = producer.queue("work")
        for i in range(20):
            poll = asyncio.create_task(q.receive(wait=5))
            await asyncio.sleep(0.02)  # the consumer is asleep in its wait
            assert not poll.done()
            assert inotify_fds() == before + 1  # the watch is on, and only one
            t0 = time.monotonic()
            await out.send(f"m{i}")
            (got,) = await asyncio.wait_for(poll, 5)
            assert got.body == f"m{i}".encode()
            assert time.monotonic() - t0 < 1.0  # woken by the watch, not the 1 s safety poll
            await got.ack()
            await asyncio.sleep(0.01)  # the wait is over: the pulse stops
        assert inotify_fds() == before + 1  # kept between waits, not reopened
    assert inotify_fds() == before  # closed with the backend
