"""The SQLite WAL stays bounded under steady load.

A WAL starts over only when a writer begins while every frame has been copied back; with
writers committing all the time a PASSIVE checkpoint never catches up with the commits
made while it runs (a producer and a worker process at 1,000 msgs/s grew the file by
~30 MB a second), so past ``_RESTART_FRAMES`` frames the checkpointer follows up with a
RESTART checkpoint, after which the next commit starts the WAL over."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import fairq
from fairq.backends.sqlite import writer


async def test_the_wal_starts_over_under_steady_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer, "_CHECKPOINT_COMMITS", 50)
    monkeypatch.setattr(writer, "_RESTART_FRAMES", 400)  # 1.6 MB of 4 KB pages
    db = tmp_path / "wal.db"
    wal = tmp_path / "wal.db-wal"
    url = f"sqlite:///{db}"
    body = b"x" * 200
    salts: set[bytes] = set()
    async with await fairq.connect(url) as producer, await fairq.connect(url) as consumer:
        out = await producer.declare_queue("work")
        q = consumer.queue("work")
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            # two connections taking turns at commits, none of them ever idle
            for _ in range(20):
                await out.send(body)
            for m in await q.receive(max_messages=20):
                await m.ack()
            with wal.open("rb") as f:  # the WAL header's salts change at every restart
                salts.add(f.read(32)[16:24])
            await asyncio.sleep(0)
    # without the RESTART follow-up the WAL never starts over in this loop (one set of
    # salts) and grows by tens of megabytes
    assert len(salts) >= 3, f"the WAL started over {len(salts) - 1} times"


async def test_a_missing_directory_names_the_four_slash_url_of_an_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sqlite:///tmp/x.db is the relative path tmp/x.db: when only the absolute one could
    exist, the error says how to write it."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(fairq.ConnectionError) as info:
        await fairq.connect(f"sqlite://{tmp_path}/x.db")  # three slashes: relative
    assert f"write sqlite:///{tmp_path}/x.db" in str(info.value)
