"""Redis restarts and kill -9 of redis-server itself (SPEC §10 rule 2, §3 rule 14), on a
private redis-server in this suite's port range (never the shared one):

* during an outage every operation raises ``fairq.ConnectionError`` within its timeout,
  and the same broker works again once Redis is back, with no user action;
* a running ``Worker`` keeps running through the outage and resumes consuming;
* with ``appendonly yes`` and ``appendfsync always``, a kill -9 of redis-server loses no
  send that had returned (a producer process sends batches; Redis dies under it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import fairq
from redis_servers import RedisCluster, RedisServer, available

HERE = Path(__file__).parent

pytestmark = pytest.mark.skipif(not available(), reason="redis-server is not installed")

AOF = ("--appendonly", "yes", "--appendfsync", "always")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path, None, *AOF).start()
    try:
        yield s
    finally:
        s.stop()


def _spawn_producer(url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "procs.py"), "send", url, "100"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )


def _url(server: RedisServer) -> str:
    return f"{server.url}?prefix=r:&timeout=1&connect_timeout=0.5"


async def test_outage_raises_then_the_same_broker_works_again(server: RedisServer) -> None:
    async with await fairq.connect(_url(server)) as broker:
        q = await broker.declare_queue("work")
        before = await q.send(b"before")
        server.kill()
        for op in (q.send(b"x"), q.receive(), q.stats(), broker.list_queues()):
            started = time.monotonic()
            with pytest.raises(fairq.ConnectionError) as info:
                await op
            assert time.monotonic() - started < 5, "an operation hung past its timeout"
            assert "127.0.0.1" in str(info.value)
        server.start()  # same port, same directory: the AOF comes back
        after = await q.send(b"after")
        got = await q.receive(max_messages=10)
        assert [m.id for m in got] == [before, after]
        assert [m.body for m in got] == [b"before", b"after"]


async def test_a_long_poll_survives_a_restart(server: RedisServer) -> None:
    async with (
        await fairq.connect(_url(server)) as broker,
        await fairq.connect(_url(server)) as other,
    ):
        q = await broker.declare_queue("work")
        server.kill()
        server.start()
        waiter = asyncio.create_task(q.receive(wait=10))
        await asyncio.sleep(0.5)  # the wake-up connection has come back meanwhile
        await other.queue("work").send(b"x")
        got = await asyncio.wait_for(waiter, 10)
        assert [m.body for m in got] == [b"x"]


def _counting_worker(
    broker: fairq.Broker,
) -> tuple[fairq.Worker, set[bytes], asyncio.Event, asyncio.Event]:
    """A Worker on queue "jobs" noting the bodies it handled; the events are set at 10 and
    at 20 of them."""
    seen: set[bytes] = set()
    ten, twenty = asyncio.Event(), asyncio.Event()
    worker = fairq.Worker(broker, concurrency=4, handle_signals=False, poll_wait=0.5)

    @worker.queue("jobs")
    async def handle(msg: fairq.Received) -> None:
        seen.add(msg.body)
        if len(seen) >= 10:
            ten.set()
        if len(seen) >= 20:
            twenty.set()

    return worker, seen, ten, twenty


async def test_a_running_worker_resumes_after_a_restart(server: RedisServer) -> None:
    async with await fairq.connect(_url(server)) as broker:
        q = await broker.declare_queue("jobs", visibility_timeout=5)
        worker, seen, ten, twenty = _counting_worker(broker)
        task = asyncio.create_task(worker.run())
        try:
            await q.send_batch([fairq.Outgoing(f"a{i}") for i in range(10)])
            await asyncio.wait_for(ten.wait(), 10)
            server.kill()
            await asyncio.sleep(1.5)  # the worker meets the outage
            assert not task.done(), f"the worker stopped: {task.exception()}"
            server.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    await q.send_batch([fairq.Outgoing(f"b{i}") for i in range(10)])
                    break
                except fairq.ConnectionError:
                    await asyncio.sleep(0.1)
            await asyncio.wait_for(twenty.wait(), 20)
            assert not task.done(), f"the worker stopped: {task.exception()}"
            assert seen >= {f"b{i}".encode() for i in range(10)}
        finally:
            worker.stop()
            await asyncio.wait_for(task, 10)


async def test_kill_9_of_redis_with_aof_always_loses_no_returned_send(
    server: RedisServer,
) -> None:
    url = _url(server)
    async with await fairq.connect(url) as broker:
        await broker.declare_queue("work")
    child = _spawn_producer(url)
    assert child.stdout is not None
    acknowledged = -1
    try:
        kill_after = 20 + os.getpid() % 11
        while acknowledged < kill_after:
            line = child.stdout.readline()
            assert line, "the producer died"
            if line.startswith("sent"):
                acknowledged = int(line.split()[1])
        server.kill()  # Redis dies under the producer, mid-batch most likely
    finally:
        child.send_signal(signal.SIGKILL)
        out = child.communicate()[0]
    for line in out.splitlines():  # batches that returned before the producer noticed
        if line.startswith("sent"):
            acknowledged = max(acknowledged, int(line.split()[1]))
    server.start()
    async with await fairq.connect(url) as broker:
        q = broker.queue("work")
        per_batch: Counter[str] = Counter()
        while batch := await q.receive(max_messages=1000):
            per_batch.update(m.attributes["batch"] for m in batch)
            await q.ack_batch([m.receipt for m in batch])
    assert set(per_batch.values()) == {100}, f"a batch was partly stored: {per_batch}"
    stored = {int(b) for b in per_batch}
    assert set(range(acknowledged + 1)) <= stored, "a batch that send_batch returned for is lost"


async def test_an_outage_under_a_running_handler_is_a_few_lines_of_log(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """While the engine is away, the worker says once that it cannot extend leases and once
    that it cannot receive, with no tracebacks, and says when the engine answers again
    (before: three chained tracebacks at every extension, every half lease)."""
    caplog.set_level("INFO", logger="fairq")
    async with await fairq.connect(_url(server)) as broker:
        q = await broker.declare_queue("long", visibility_timeout=2)
        started, done = asyncio.Event(), asyncio.Event()
        worker = fairq.Worker(broker, concurrency=2, handle_signals=False, poll_wait=0.2)

        @worker.queue("long")
        async def handle(msg: fairq.Received) -> None:
            started.set()
            await asyncio.sleep(6)  # extended every half second while it runs
            done.set()

        task = asyncio.create_task(worker.run())
        try:
            await q.send(b"slow")
            await asyncio.wait_for(started.wait(), 10)
            server.kill()
            await asyncio.sleep(3)
            server.start()
            await asyncio.wait_for(done.wait(), 15)
        finally:
            worker.stop()
            await asyncio.wait_for(task, 10)
    text = caplog.text
    assert "Traceback" not in text
    assert text.count("could not extend leases") == 1, text
    assert text.count("cannot be reached") == 1, text
    assert "answers again" in text


async def test_a_kept_alive_claim_outlives_an_outage_shorter_than_its_lease(
    server: RedisServer,
) -> None:
    """An extension that fails while Redis restarts is tried again until one works: the
    claim is never left to run out under running work (another claimer would run it too)."""
    async with (
        await fairq.connect(_url(server)) as broker,
        await fairq.connect(_url(server)) as other,
    ):
        store, rival = broker.idempotency("charges", ttl=60), other.idempotency("charges", ttl=60)
        claim = await store.claim("order-1", lease=3)
        assert claim is not None
        async with claim.kept_alive():
            await asyncio.sleep(1.2)  # one extension made (at 1 s)
            server.kill()
            await asyncio.sleep(1.0)  # the next one (at 2.2 s) meets the outage
            server.start()
            deadline = time.monotonic() + 5  # 4 s after the last extension that worked
            while time.monotonic() < deadline:
                with contextlib.suppress(fairq.ConnectionError):
                    assert await rival.claim("order-1", lease=3) is None, "the claim ran out"
                await asyncio.sleep(0.2)
        await claim.complete("charged")
        assert await rival.get("order-1") is not None


async def test_a_room_admitter_goes_on_after_a_restart(server: RedisServer) -> None:
    """``run_admitter`` meets ``fairq.ConnectionError`` while Redis restarts, logs it and
    admits again once Redis is back (it used to end with the error, stopping admission)."""
    async with await fairq.connect(_url(server)) as broker:
        room = await broker.waiting_room("sale", admit_rate=50)
        await room.join_many([f"fan-{i}" for i in range(2000)])
        task = asyncio.create_task(room.run_admitter(tick=0.05, lease=1.0))
        try:
            await asyncio.sleep(0.5)
            server.kill()
            await asyncio.sleep(1.5)
            assert not task.done(), f"the admitter ended: {task.exception()}"
            server.start()
            deadline = time.monotonic() + 10
            before = None
            while before is None:
                assert time.monotonic() < deadline
                with contextlib.suppress(fairq.ConnectionError):
                    before = (await room.stats()).admitted
                await asyncio.sleep(0.1)
            await asyncio.sleep(2.0)
            assert not task.done(), f"the admitter ended: {task.exception()}"
            assert (await room.stats()).admitted >= before + 40  # ~50/s again
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _owner(cluster: RedisCluster, tag: str) -> int:
    """The port of the master that holds hash tag ``tag``'s slot."""
    slot = int(
        subprocess.run(
            ["redis-cli", "-p", str(cluster.nodes[0].port), "cluster", "keyslot", tag],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    out = subprocess.run(
        ["redis-cli", "-p", str(cluster.nodes[0].port), "cluster", "shards"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    # the node's port follows its "port" field; its slot ranges come before its "nodes"
    ports = [n.port for n in cluster.nodes]
    shards: list[tuple[list[int], int]] = []
    ranges: list[int] = []
    for i, word in enumerate(out):
        if word == "slots":
            ranges = []
            j = i + 1
            while j < len(out) and out[j].isdigit():
                ranges.append(int(out[j]))
                j += 1
        if word == "port" and int(out[i + 1]) in ports:
            shards.append((ranges, int(out[i + 1])))
    for ranges, port in shards:
        if any(lo <= slot <= hi for lo, hi in zip(ranges[::2], ranges[1::2], strict=True)):
            return port
    raise AssertionError(f"no master holds slot {slot}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    c = RedisCluster(tmp_path_factory.mktemp("cluster")).start()
    try:
        yield c
    finally:
        c.stop()


async def test_a_cluster_url_may_name_several_seed_nodes(cluster: RedisCluster) -> None:
    """``redis+cluster://h1:p1,h2:p2``: a process starts while its first seed node is down
    (here a port nobody listens on), from the next one that answers."""
    ports = [n.port for n in cluster.nodes]
    url = f"redis+cluster://127.0.0.1:1,127.0.0.1:{ports[1]},127.0.0.1:{ports[2]}?prefix=s:"
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("seeds")
        await q.send(b"x")
        (got,) = await q.receive()
        assert got.body == b"x"
        await got.ack()
    with pytest.raises(fairq.ConnectionError, match="several hosts need redis"):
        await fairq.connect(f"redis://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}")


async def test_a_worker_keeps_running_while_the_cluster_is_down(cluster: RedisCluster) -> None:
    """A master of a Redis Cluster dies: until the cluster settles every node answers
    CLUSTERDOWN, even for keys of healthy masters. That is an outage like any other
    (``fairq.ConnectionError``, so a Worker waits it out); it was a BackendError, and
    every running worker of every queue stopped."""
    url = f"{cluster.url}?prefix=c:&timeout=2&connect_timeout=0.5"
    victim = next(
        n for n in cluster.nodes[1:] if n.port != _owner(cluster, "jobs")
    )  # not the seed, not the queue's own master
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("jobs", visibility_timeout=5)
        worker, seen, ten, twenty = _counting_worker(broker)
        task = asyncio.create_task(worker.run())
        try:
            await q.send_batch([fairq.Outgoing(f"a{i}") for i in range(10)])
            await asyncio.wait_for(ten.wait(), 10)
            victim.kill()
            deadline = time.monotonic() + 20
            down = ""
            while not down:  # the other masters mark it failed within a few seconds
                assert time.monotonic() < deadline, "the cluster never said it was down"
                try:
                    await q.stats()
                    await asyncio.sleep(0.2)
                except fairq.ConnectionError as exc:
                    if "CLUSTERDOWN" in str(exc).upper() or "down" in str(exc):
                        down = str(exc)
            assert "not serving now" in down
            await asyncio.sleep(1.5)  # the worker meets it too
            assert not task.done(), f"the worker stopped: {task.exception()}"
            victim.start()
            deadline = time.monotonic() + 30
            while True:
                try:
                    await q.send_batch([fairq.Outgoing(f"b{i}") for i in range(10)])
                    break
                except fairq.ConnectionError:
                    assert time.monotonic() < deadline, "the cluster did not come back"
                    await asyncio.sleep(0.2)
            await asyncio.wait_for(twenty.wait(), 30)
            assert not task.done(), f"the worker stopped: {task.exception()}"
            assert seen >= {f"b{i}".encode() for i in range(10)}
        finally:
            worker.stop()
            await asyncio.wait_for(task, 10)
