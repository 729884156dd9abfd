"""SPEC §10 rule 2 on PostgreSQL, on a cluster of the test's own: while the server is
down, operations raise ``fairq.ConnectionError`` within their timeout; once it is back the
same broker works with no user action, a waiting consumer and a running Worker resume;
after a kill -9 of the postmaster no send that had returned is lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

import fairq
from services import require as _require

from .cluster import Cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    _require("postgres")  # the binaries come with the shared server's packages
    c = Cluster()
    c.start()
    try:
        yield c
    finally:
        c.remove()


def _url(cluster: Cluster, schema: str) -> str:
    return f"{cluster.url}?schema={schema}&timeout=3&connect_timeout=2"


async def test_restart_raises_then_recovers(cluster: Cluster) -> None:
    async with await fairq.connect(_url(cluster, "restart")) as b:
        q = await b.declare_queue("jobs")
        await q.send(b"before")
        waiting_consumer = await fairq.connect(_url(cluster, "restart"))
        waiter = asyncio.create_task(waiting_consumer.queue("jobs").receive(wait=60))
        (first,) = await waiter
        assert first.body == b"before"
        await first.ack()
        waiter = asyncio.create_task(waiting_consumer.queue("jobs").receive(wait=60))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(cluster.stop)
        for op in (q.send(b"during"), q.receive(), q.stats()):
            started = time.monotonic()
            with pytest.raises(fairq.ConnectionError):
                await op
            assert time.monotonic() - started < 8, "an operation must fail within its timeout"
        await asyncio.to_thread(cluster.start)
        deadline = time.monotonic() + 20
        while True:  # the first try after the restart may still meet a stale connection
            try:
                mid = await q.send(b"after")
                break
            except fairq.ConnectionError:
                assert time.monotonic() < deadline, "the broker did not come back"
                await asyncio.sleep(0.2)
        assert (await q.stats()).visible == 1
        # the long poll that was waiting when the server went away raised (it must not
        # hang past its timeout); the same consumer broker receives again
        assert waiter.done()
        with pytest.raises(fairq.ConnectionError):
            waiter.result()
        got = await waiting_consumer.queue("jobs").receive(wait=10)
        assert [m.id for m in got] == [mid]
        await waiting_consumer.close()


async def test_a_running_worker_resumes_after_a_restart(cluster: Cluster) -> None:
    url = _url(cluster, "worker")
    async with await fairq.connect(url) as b:
        q = await b.declare_queue("tasks")
        seen: list[bytes] = []
        worker = fairq.Worker(b, concurrency=4)

        @worker.queue("tasks")
        async def handle(msg: fairq.Received) -> None:
            seen.append(msg.body)

        running = asyncio.create_task(worker.run())
        await q.send(b"one")
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.05)
        assert seen == [b"one"]
        await asyncio.to_thread(cluster.stop)
        await asyncio.sleep(1.0)  # the worker meets the outage
        assert not running.done(), "the worker must keep running through an outage"
        await asyncio.to_thread(cluster.start)
        deadline = time.monotonic() + 20
        while True:
            try:
                await q.send(b"two")
                break
            except fairq.ConnectionError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
        for _ in range(400):
            if b"two" in seen:
                break
            await asyncio.sleep(0.05)
        assert b"two" in seen
        worker.stop()
        await asyncio.wait_for(running, 20)


async def test_the_broker_is_back_soon_after_a_long_outage(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The pool retries a lost connection with doubling delays: after an outage of 20 s
    its next try came 8.8 s after the server was back here (after 2 minutes, ~2 minutes).
    fairq ends each retry chain after 5 s, so the next operation starts a new one (0.01 s)."""
    async with await fairq.connect(_url(cluster, "long")) as b:
        q = await b.declare_queue("jobs")
        await q.send(b"before")
        await asyncio.to_thread(cluster.stop)
        try:
            outage_end = time.monotonic() + 20
            while time.monotonic() < outage_end:  # a producer that keeps trying
                with pytest.raises(fairq.ConnectionError):
                    await q.send(b"during")
                await asyncio.sleep(0.5)
        finally:
            await asyncio.to_thread(cluster.start)
        back = time.monotonic()
        while True:
            try:
                await q.send(b"after")
                break
            except fairq.ConnectionError:
                assert time.monotonic() - back < 30, "the broker did not come back"
                await asyncio.sleep(0.2)
        took = time.monotonic() - back
        assert took < 4, f"the first send after the restart took {took:.1f} s"
        assert (await q.stats()).visible == 2
    noise = [r for r in caplog.records if r.name == "psycopg.pool" and "connecting" in r.msg]
    assert not noise, "the pool's retries of fairq's own connections are not logged"


async def test_a_send_waiting_through_an_outage_goes_through_once_the_server_is_back(
    cluster: Cluster,
) -> None:
    """A send that began while the server was down waits for a connection (its timeout:
    20 s here). The pool's retry chain for it gives up after 5 s; the server is back after
    8 s. Before, that send waited out its whole timeout and failed; now it asks again each
    second, starting a new chain, and is stored soon after the server is back."""
    url = f"{cluster.url}?schema=waiting&timeout=20&connect_timeout=2"
    async with await fairq.connect(url) as b:
        q = await b.declare_queue("jobs")
        await q.send(b"before")
        await asyncio.to_thread(cluster.stop)
        try:
            with pytest.raises(fairq.ConnectionError):
                await q.send(b"meets the dead connection")  # the pooled one: fails at once
            started = time.monotonic()
            waiting = asyncio.create_task(q.send(b"waits"))
            await asyncio.sleep(8)
            assert not waiting.done(), "it waits for a connection meanwhile"
        finally:
            await asyncio.to_thread(cluster.start)
        back = time.monotonic()
        await asyncio.wait_for(waiting, 20)
        took = time.monotonic() - back
        assert took < 4, f"stored {took:.1f} s after the server was back ({back - started:.0f} s)"
        assert (await q.stats()).visible == 2


_SENDER = """
import asyncio, faulthandler, signal, sys, time
import fairq

def dump_tasks():  # the test asks for this when the sender does not end in time
    for task in asyncio.all_tasks():
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()

async def main(url):
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump_tasks)
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    b = await fairq.connect(url)
    q = b.queue("durable")
    i = 0
    while True:
        started = time.monotonic()
        try:
            mid = await q.send(str(i).encode())
        except fairq.ConnectionError:
            print(f"raised-after {time.monotonic() - started:.3f}", flush=True)
            break
        print(mid, flush=True)  # printed only once the send returned
        i += 1
    # closed, as a program should: left open, psycopg-pool's reconnecting worker can
    # swallow asyncio.run()'s cancel at exit and keep the process alive
    await asyncio.wait_for(b.close(), 10)

asyncio.run(main(sys.argv[1]))
"""


async def test_kill9_of_the_postmaster_loses_no_returned_send(cluster: Cluster) -> None:
    import os
    import signal
    import sys

    url = _url(cluster, "durable")
    async with await fairq.connect(url) as b:
        await b.declare_queue("durable")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _SENDER,
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.stdout is not None
    returned: list[str] = []
    while len(returned) < 300:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line, "the sender stopped early"
        returned.append(line.decode().strip())
    await asyncio.to_thread(cluster.kill9)
    try:
        rest, _ = await asyncio.wait_for(proc.communicate(), 30)
    except TimeoutError:
        proc.send_signal(signal.SIGUSR1)  # the sender's tasks and threads, for the report
        await asyncio.sleep(0.5)
        proc.send_signal(signal.SIGUSR2)
        await asyncio.sleep(0.5)
        proc.kill()
        _, err = await proc.communicate()
        pytest.fail("the sender did not end within 30 s of the crash:\n" + err.decode()[-6000:])
    lines = rest.decode().splitlines()
    assert lines and lines[-1].startswith("raised-after "), "the sender did not raise"
    # the send in flight (or the next one) raised ConnectionError within its timeout (3 s)
    assert float(lines[-1].split()[1]) < 3 + 1.5
    returned += [x for x in lines[:-1] if x]
    await asyncio.to_thread(cluster.start)  # crash recovery replays the WAL
    async with await fairq.connect(url) as b:
        q = b.queue("durable")
        stored = {m.id for m in await q.peek(limit=10_000)}
    missing = [m for m in returned if m not in stored]
    assert not missing, f"{len(missing)} returned sends lost, e.g. {missing[:3]}"
    assert len(returned) >= 300


async def test_an_idle_workers_health_says_the_engine_is_away_within_seconds(
    cluster: Cluster,
) -> None:
    """A worker waiting in a long poll learns of an outage only at its next receive, after
    the engine's whole timeout (30 s by default); with metrics served it asks the engine
    every second, so ``/healthz`` is 503 within seconds of the stop and 200 soon after the
    start (an operator's review: a 15 s outage never showed)."""
    import httpx

    async with await fairq.connect(f"{cluster.url}?schema=health") as broker:
        await broker.declare_queue("quiet")
        worker = fairq.Worker(broker, handle_signals=False, metrics_port=0, poll_wait=30)
        worker.queue("quiet")(lambda msg: None)
        task = asyncio.create_task(worker.run())
        try:
            deadline = time.monotonic() + 10
            while worker.metrics_address is None:
                assert time.monotonic() < deadline and not task.done()
                await asyncio.sleep(0.05)
            host, port = worker.metrics_address
            async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=5) as http:

                async def health_becomes(status: int, within: float) -> None:
                    started = time.monotonic()
                    while (await http.get("/healthz")).status_code != status:
                        assert time.monotonic() - started < within, f"no {status}"
                        await asyncio.sleep(0.1)

                await health_becomes(200, 5)
                cluster.stop()
                try:
                    await health_becomes(503, 5)
                    page = (await http.get("/metrics")).text
                    assert "fairq_worker_backend_up 0" in page
                finally:
                    cluster.start()
                await health_becomes(200, 10)
        finally:
            worker.stop()
            await asyncio.wait_for(task, 40)


async def test_a_health_check_answers_at_once_while_the_server_refuses(cluster: Cluster) -> None:
    """``ping`` (the server's and the worker's /healthz) asks a connection of its own once
    the pool has seen trouble: a server that refuses connections is reported at once and
    by name, where a pooled call waits its whole timeout for the pool to reconnect; an
    operation that does time out says why the pool could not connect."""
    url = f"{cluster.url}?schema=health&timeout=2&connect_timeout=2"
    async with await fairq.connect(url) as b:
        q = await b.declare_queue("jobs")
        await b.backend.ping()
        await asyncio.to_thread(cluster.stop)
        try:
            with pytest.raises(fairq.ConnectionError):
                await q.send(b"during")  # meets the dead connection, or waits it out
            for _ in range(3):
                started = time.monotonic()
                with pytest.raises(fairq.ConnectionError, match=r"(?i)refused"):
                    await b.backend.ping()
                assert time.monotonic() - started < 1.0
            with pytest.raises(fairq.ConnectionError, match=r"within 2 s \(.*(?i:refused)"):
                await q.stats()
        finally:
            await asyncio.to_thread(cluster.start)
        deadline = time.monotonic() + 20
        while True:  # healthy again once the server answers
            try:
                await b.backend.ping()
                break
            except fairq.ConnectionError:
                assert time.monotonic() < deadline, "the health check did not come back"
                await asyncio.sleep(0.2)
        await q.send(b"after")
