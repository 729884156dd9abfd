"""kill -9 and restarts on SQLite, Redis and PostgreSQL (SPEC §3 rule 14, issue acceptance):

* a consumer killed while it holds leases loses nothing: every message comes back
  after the visibility timeout;
* a producer killed during ``send_batch`` leaves each batch wholly there or wholly
  absent, and every batch it was told was stored is there after reopening;
* a receive(wait=...) in one process sees a send from another within tens of ms;
* an attention worker killed mid-slice leaves few messages leased (to be delivered
  again): slices ack as they go and lease little ahead, and what they acked is counted.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import fairq
from services import backend_url, drop_namespace, require

HERE = Path(__file__).parent


def spawn(role: str, url: str, arg: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "procs.py"), role, url, str(arg)],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )


def read_line(proc: subprocess.Popen[str], prefix: str, timeout: float = 20.0) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"child never printed {prefix!r}")


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'crash.db'}"
        return
    require(request.param)
    made = backend_url(request.param, tmp_path, f"crash-{secrets.token_hex(6)}")
    yield made
    drop_namespace(made)


async def test_killed_consumer_loses_nothing(url: str) -> None:
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("work", visibility_timeout=30)
        ids = await q.send_batch([fairq.Outgoing(str(i)) for i in range(200)])
    child = spawn("hold", url, 50)
    leased = read_line(child, "leased").split()[1:]
    assert len(leased) == 50
    child.send_signal(signal.SIGKILL)
    child.wait()
    async with await fairq.connect(url) as broker:
        q = broker.queue("work")
        seen: dict[str, int] = {}
        deadline = time.monotonic() + 20
        while len(seen) < 200 and time.monotonic() < deadline:
            for m in await q.receive(max_messages=100, wait=2):
                seen[m.id] = m.attempt
                await m.ack()
        assert sorted(seen) == sorted(ids), "a message was lost"
        assert {seen[i] for i in leased} == {2}, "the killed consumer's messages came back"
        assert Counter(seen.values()) == {1: 150, 2: 50}
        s = await q.stats()
        assert (s.visible, s.in_flight, s.acked, s.redelivered) == (0, 0, 200, 50)


@pytest.mark.parametrize("sync", ["normal", "full", "redis", "postgres"])
async def test_killed_producer_batches_are_whole(tmp_path: Path, sync: str) -> None:
    if sync in ("normal", "full"):
        await _killed_producer(f"sqlite:///{tmp_path / 'p.db'}?synchronous={sync}")
        return
    require(sync)
    url = backend_url(sync, tmp_path, f"crash-{secrets.token_hex(6)}")
    try:
        await _killed_producer(url)
    finally:
        drop_namespace(url)


async def _killed_producer(url: str) -> None:
    async with await fairq.connect(url) as broker:
        await broker.declare_queue("work")
    child = spawn("send", url, 250)
    acknowledged = -1
    kill_after = 8 + os.getpid() % 7  # vary the moment a little between runs
    while acknowledged < kill_after:
        acknowledged = int(read_line(child, "sent").split()[1])
    child.send_signal(signal.SIGKILL)
    child.wait()
    async with await fairq.connect(url) as broker:
        q = broker.queue("work")
        per_batch: Counter[str] = Counter()
        while batch := await q.receive(max_messages=1000):
            per_batch.update(m.attributes["batch"] for m in batch)
            await q.ack_batch([m.receipt for m in batch])
    assert set(per_batch.values()) == {250}, f"a batch was partly stored: {per_batch}"
    stored = {int(b) for b in per_batch}
    assert set(range(acknowledged + 1)) <= stored, "a batch that send_batch returned for is missing"
    assert stored == set(range(len(stored))), "batches are stored in order, none skipped"


async def test_one_producer_two_consumer_processes(url: str) -> None:
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("work")
        consumers = [spawn("consume-slowly", url, 7.0) for _ in range(2)]
        for c in consumers:
            read_line(c, "ready")
        await asyncio.sleep(0.3)  # both are now in a long poll
        ids = []
        for _ in range(30):
            ids.append(await q.send(repr(time.time())))
            await asyncio.sleep(0.1)
    got: dict[str, float] = {}
    who: Counter[int] = Counter()
    for n, c in enumerate(consumers):
        out, _ = c.communicate(timeout=30)
        for line in out.splitlines():
            if line.startswith("got"):
                _, mid, latency = line.split()
                assert mid not in got, "a message was delivered twice"
                got[mid] = float(latency)
                who[n] += 1
    assert sorted(got) == sorted(ids)
    assert len(who) == 2, f"both consumers should have had work: {who}"
    latencies = sorted(got.values())
    # the consumers poll the file's change counter every 20 ms: far below a 1 s sleep-poll
    assert statistics.median(latencies) < 0.1, latencies
    # the slowest one only shows nothing waited for a lease to run out (a loaded machine
    # delays a few by a scheduling hiccup; the median above is the real measure)
    assert latencies[-1] < 1.5, latencies


async def test_killed_attention_publisher_leaves_no_work_without_a_signal(url: str) -> None:
    async with await fairq.connect(url) as broker:
        await broker.declare_attention("market")
    child = spawn("attention", url, 20)
    for _ in range(3):
        read_line(child, "round")
    child.send_signal(signal.SIGKILL)  # somewhere inside a publish
    child.wait()
    async with await fairq.connect(url) as broker:
        a = broker.attention("market")
        keys = await a.key_stats(top=100)
        with_work = [k for k in keys if k.backlog]
        assert with_work, "the publisher got some work in"
        assert all(k.pending == 1 for k in with_work), [(k.key, k.backlog, k.pending) for k in keys]
        assert all(k.backlog % 3 == 0 for k in keys), "each publish_batch is whole or absent"
        assert await a.reconcile() == 0, "no work was left without its signal"


async def test_a_killed_attention_worker_leaves_little_leased(url: str) -> None:
    async with await fairq.connect(url) as broker:
        a = await broker.declare_attention("market", plans={"basic": fairq.Plan(1, 50, 20.0)})
        for k in range(20):
            await a.publish_batch(f"store-{k}", [fairq.Outgoing(b"x") for _ in range(400)])
        queues = [await a.queue(f"store-{k}") for k in range(20)]

        async def leased() -> int:
            return sum([(await q.stats()).in_flight for q in queues])

        left = []
        for _ in range(3):
            before = await leased()
            child = spawn("attention-worker", url, 4)
            read_line(child, "handled 300", timeout=60)
            child.send_signal(signal.SIGKILL)  # mid-slice: 4 slices run
            child.wait()
            left.append(await leased() - before)
        # what the killed slices acked is counted: acks and counts are one step
        acked = sum([(await q.stats()).acked for q in queues])
        counted = sum(k.processed for k in await a.key_stats(top=100))
    # per kill: 4 slices, each with its running message, what it leased ahead and what is
    # handled but whose ack is on its way; acking at the end of a slice left dozens
    assert sum(left) <= 3 * 16, f"messages left leased by each kill: {left}"
    assert counted == acked >= 750, f"processed {counted} of {acked} acked"
