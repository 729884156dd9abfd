"""A worker's own ``/metrics`` and ``/healthz`` (``worker/metrics.py``): served by the running
worker on ``metrics_port``, counting what its handlers did per queue; ``/healthz`` says
503 while the engine is away or the worker stops."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import fairq
from fairq.worker.metrics import BUCKETS, HandlerTimes, QueueRun, Reading, health, render


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample of a Prometheus text page."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = "^" + re.escape(name + (f"{{{want}}}" if want else "")) + r" (\S+)$"
    found = re.search(pattern, text, re.M)
    assert found, f"no {name} {labels} in\n{text}"
    return float(found.group(1))


async def test_a_running_worker_serves_its_numbers(tmp_path: Path) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'm.db'}") as broker:
        q = await broker.declare_queue("orders", max_attempts=1, dead_letter=None)
        bodies = (b"ok", b"ok", b"boom", b"reject", b"self")
        await q.send_batch([fairq.Outgoing(b) for b in bodies])
        worker = fairq.Worker(broker, concurrency=3, handle_signals=False, metrics_port=0)

        @worker.queue("orders", concurrency=2)
        async def handle(msg: fairq.Received) -> None:
            if msg.body == b"boom":
                raise ValueError("boom")
            if msg.body == b"reject":
                raise fairq.Reject("bad")
            if msg.body == b"self":  # settled here: the worker's own ack finds no lease
                await msg.ack()
            await asyncio.sleep(0.02)

        task = asyncio.create_task(worker.run())
        try:
            deadline = time.monotonic() + 10
            while (await q.stats()).depth or worker.metrics_address is None:
                assert time.monotonic() < deadline and not task.done()
                await asyncio.sleep(0.02)
            host, port = worker.metrics_address
            async with httpx.AsyncClient(base_url=f"http://{host}:{port}") as http:
                deadline = time.monotonic() + 10
                while True:
                    page = (await http.get("/metrics")).text
                    if _sample(page, "fairq_worker_ack_failed_total") == 1:
                        break
                    assert time.monotonic() < deadline, page
                    await asyncio.sleep(0.02)
                r = await http.get("/metrics")
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
                page = r.text
                assert _sample(page, "fairq_worker_received_total", queue="orders") == 5
                # every ack sent counts, the one the engine did not take too (never down)
                assert _sample(page, "fairq_worker_acks_total") == 3
                assert _sample(page, "fairq_worker_lease_lost_total") == 1
                for outcome, n in (("ok", 3), ("failed", 1), ("rejected", 1), ("duplicate", 0)):
                    got = _sample(
                        page, "fairq_worker_handled_total", queue="orders", outcome=outcome
                    )
                    assert got == n, outcome
                assert _sample(page, "fairq_worker_handler_seconds_count", queue="orders") == 5
                assert _sample(page, "fairq_worker_handler_seconds_sum", queue="orders") >= 0.04
                inf = _sample(
                    page, "fairq_worker_handler_seconds_bucket", queue="orders", le="+Inf"
                )
                fast = _sample(
                    page, "fairq_worker_handler_seconds_bucket", queue="orders", le="0.01"
                )
                assert inf == 5 and fast == 2  # the two that raised at once
                assert _sample(page, "fairq_worker_concurrency", queue="orders") == 2
                assert _sample(page, "fairq_worker_running", queue="orders") == 0
                assert _sample(page, "fairq_worker_slots") == 3
                assert _sample(page, "fairq_worker_backend_up") == 1
                r = await http.get("/healthz")
                assert (r.status_code, r.json()) == (200, {"status": "ok", "running": 0})
                assert (await http.get("/nothing")).status_code == 404
                assert (await http.post("/metrics")).status_code == 405
        finally:
            worker.stop()
            await asyncio.wait_for(task, 10)
        assert worker.metrics_address is None
        with pytest.raises(OSError):  # the port is closed with the worker
            socket.create_connection((host, port), timeout=1).close()


async def test_a_taken_port_is_one_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with await fairq.connect(f"sqlite:///{tmp_path / 'p.db'}") as broker:
            await broker.declare_queue("orders")
            worker = fairq.Worker(broker, handle_signals=False, metrics_port=port)
            worker.queue("orders")(lambda msg: None)
            with pytest.raises(fairq.InvalidOption, match=f"127.0.0.1:{port}"):
                await worker.run()
    for bad in (-1, 70000, "9108", True):
        with pytest.raises(fairq.InvalidOption, match="metrics_port"):
            fairq.Worker(metrics_port=bad)  # type: ignore[arg-type]


def _reading(**given: Any) -> Reading:
    """A reading of a worker with one queue ``a``, ``given`` fields replaced."""
    fields: dict[str, Any] = {
        "queues": {"a": QueueRun()},
        "running": {"a": 2},
        "concurrency": {"a": 4},
        "slots": 4,
        "acked": 0,
        "ack_failed": 0,
        "released": 0,
        "lease_lost": 0,
        "backend_down": None,
        "stopping": False,
    }
    return Reading(**{**fields, **given})


def test_health_is_503_while_the_engine_is_away_or_the_worker_stops() -> None:
    assert health(_reading()) == (200, {"status": "ok", "running": 2})
    away = _reading(backend_down=12.34)
    assert health(away) == (
        503,
        {"status": "backend_unreachable", "down_seconds": 12.3, "running": 2},
    )
    page = render(away)
    assert _sample(page, "fairq_worker_backend_up") == 0
    assert _sample(page, "fairq_worker_backend_down_seconds") == 12.34
    stopping = _reading(stopping=True)
    assert health(stopping)[0] == 503 and health(stopping)[1]["status"] == "stopping"


def test_the_histogram_is_cumulative_and_labels_are_escaped() -> None:
    times = HandlerTimes()
    for s in (0.001, 0.005, 0.007, 2.0, 1000.0):
        times.observe(s)
    run = QueueRun(received=5, ok=5, times=times)
    page = render(_reading(queues={'we"ird\\q': run}, running={}, concurrency={}))
    label = 'we\\"ird\\\\q'
    buckets = [
        _sample(page, "fairq_worker_handler_seconds_bucket", queue=label, le=str(b))
        for b in BUCKETS
    ]
    assert buckets[0] == 2  # le=0.005 holds 0.001 and 0.005
    assert buckets[BUCKETS.index(0.01)] == 3 and buckets[BUCKETS.index(2.5)] == 4
    assert buckets == sorted(buckets) and buckets[-1] == 4
    assert _sample(page, "fairq_worker_handler_seconds_bucket", queue=label, le="+Inf") == 5


def test_fairq_worker_serves_them_from_the_command_line(tmp_path: Path) -> None:
    """``fairq worker --metrics-port``: /healthz answers while it runs; SIGTERM ends it."""
    (tmp_path / "app.py").write_text(
        textwrap.dedent(
            """
            import fairq
            worker = fairq.Worker()

            @worker.queue("jobs")
            async def handle(msg):
                pass
            """
        )
    )
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    send = [sys.executable, "-m", "fairq", "send", "jobs", "hello", "--url", url]
    subprocess.run(send, check=True, capture_output=True, timeout=60)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "fairq", "worker", "app:worker", "--url", url]
    cmd += ["--metrics-port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()[0].decode()
            try:
                page = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                if _sample(page, "fairq_worker_acks_total") == 1:
                    break
            except (httpx.TransportError, AssertionError):
                pass
            assert time.monotonic() < deadline, "the worker never served its metrics"
            time.sleep(0.1)
        r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
        assert r.status_code == 200 and r.json()["status"] == "ok"
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 0, out
    assert f"worker metrics on http://127.0.0.1:{port}/metrics" in out


async def test_an_idle_metrics_connection_ends_with_the_worker(tmp_path: Path) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'i.db'}") as broker:
        await broker.declare_queue("orders")
        worker = fairq.Worker(broker, handle_signals=False, metrics_port=0, poll_wait=0.2)
        worker.queue("orders")(lambda msg: None)
        task = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 10
        while worker.metrics_address is None:
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.02)
        host, port = worker.metrics_address
        reader, writer = await asyncio.open_connection(host, port)  # says nothing
        worker.stop()
        await asyncio.wait_for(task, 5)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the worker
        writer.close()
