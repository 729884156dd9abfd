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


async def test_big_batches_back_to_back_keep_the_wal_small(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few commits of big batches never reach ``_CHECKPOINT_COMMITS`` and never leave
    the writer quiet: the WAL's size starts a checkpoint too (back-to-back batches of
    20,000 once grew it to 2 GB), and the file is cut down to ``journal_size_limit`` when
    it starts over."""
    monkeypatch.setattr(writer, "_CHECKPOINT_BYTES", 2 * 1024 * 1024)
    monkeypatch.setattr(writer, "_RESTART_FRAMES", 256)
    monkeypatch.setattr(writer, "_JOURNAL_SIZE_LIMIT", 512 * 1024)
    db = tmp_path / "batches.db"
    wal = tmp_path / "batches.db-wal"
    body = b"x" * 1000
    largest = 0
    async with await fairq.connect(f"sqlite:///{db}") as broker:
        q = await broker.declare_queue("bulk")
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:  # ~0.5 MB a commit, never idle
            await q.send_batch([fairq.Outgoing(body) for _ in range(500)])
            while got := await q.receive(max_messages=500):
                await q.ack_batch([m.receipt for m in got])
            largest = max(largest, wal.stat().st_size)
            await asyncio.sleep(0.01)  # room for the checkpointer thread on a busy machine
        # measured: at most ~18 MB (the checkpointer looks every 0.1 s); before, 400 MB in 3 s
        assert largest < 64 * 1024 * 1024, f"the WAL reached {largest / 1e6:.0f} MB"
        # after the burst, small commits: the file is cut down to the limit when the WAL
        # starts over (it stayed at its largest, and every look found it "too large")
        deadline = time.monotonic() + 5.0
        while wal.stat().st_size > writer._CHECKPOINT_BYTES and time.monotonic() < deadline:
            await q.send(b"small")
            await asyncio.sleep(0.02)
        assert wal.stat().st_size <= writer._CHECKPOINT_BYTES, wal.stat().st_size


async def test_a_percent_encoded_path_names_the_file_it_decodes_to(tmp_path: Path) -> None:
    """``%20`` in a ``sqlite://`` URL is a space, as in any URL (it was looked for as the
    three characters, and a directory "with%20space" did not exist)."""
    (tmp_path / "with space").mkdir()
    async with await fairq.connect(f"sqlite:///{tmp_path}/with%20space/a%20b.db") as broker:
        await broker.declare_queue("q")
    assert (tmp_path / "with space" / "a b.db").exists()


async def test_a_directory_for_a_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(fairq.ConnectionError, match="a directory: name a file in it"):
        await fairq.connect(f"sqlite:///{tmp_path}")
