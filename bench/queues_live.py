"""The queue benchmark's live phases: what a consumer in one process sees of a producer in
another, and the Worker draining a backlog. Called by ``bench.queues``; each helper
process is this module run as ``python -m bench.queues_live <role> ...``.

* **wake-up**: a consumer long-polls (``receive(wait=...)``) an empty queue; the producer
  sends one message at a time, each after a random pause of 5-25 ms, so every message
  finds the consumer asleep. Latency = receive returns − ``time.time()`` stamped in the
  body just before ``send``.
* **end to end at a steady rate**: the producer process sends at a steady 1,000 msgs/s
  (each send at its scheduled time, not a flood); the consumer is a ``fairq.Worker`` with
  a no-op async handler (latency = handler start − stamp), beside the raw sqlite3 loop
  consuming with a 1 ms poll (latency = its receive returns − stamp).
* **idle long poll**: a consumer long-polls an empty queue for ``idle_s`` seconds; its
  process CPU time (user + system, all threads) over that wall time.
* **Worker drain**: a backlog of N messages drained by ``fairq.Worker`` (no-op async
  handler) with ``concurrency=100`` (it receives up to 100 at a time, as the low-level
  loop does) and with the default 16, beside ``receive(100)`` + ``ack_batch`` on the same
  backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import random
import resource
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

import fairq

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "bench"
RATE = 1000.0  # msgs/s of the steady producer
WORKER_CONCURRENCY = 16


def _stamped(seq: int) -> bytes:
    return orjson.dumps({"seq": seq, "t": time.time(), "pad": "x" * 160})


def _latency(body: bytes) -> float:
    return time.time() - float(orjson.loads(body)["t"])


def _url(path: str) -> str:
    return "sqlite:///" + path


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# -- the minimal raw loop's table, shared by its producer and consumer ---------------------
def raw_open(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=10)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS q (id INTEGER PRIMARY KEY, body BLOB NOT NULL, "
        "visible_at REAL NOT NULL, lease INTEGER)"
    )
    return conn


def raw_send(conn: sqlite3.Connection, body: bytes) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO q (body, visible_at) VALUES (?, ?)", (body, time.time()))
    conn.execute("COMMIT")


# -- helper processes ----------------------------------------------------------------------
def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.queues_live", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"bench helper failed ({proc.returncode}):\n{err}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        _, err = proc.communicate(timeout=10)
        raise RuntimeError(f"bench helper did not start: {line!r}\n{err}")


async def _producer(kind: str, path: str, n: int, rate: float, pause: float) -> dict[str, Any]:
    """Send ``n`` stamped messages: at ``rate`` per second, or each after a random pause
    of ``pause``..5x``pause`` seconds (``rate`` 0)."""
    rng = random.Random(7)
    late = 0
    took: list[float] = []
    committed: list[float] = []  # time.time() when each send had returned
    if kind == "raw":
        conn = raw_open(path)
        send = lambda seq: raw_send(conn, _stamped(seq))  # noqa: E731
    else:
        broker = await fairq.connect(_url(path))
        q = broker.queue(QUEUE)
    print("ready", flush=True)
    await asyncio.sleep(0.2)  # let the consumer settle into its wait
    t0 = time.perf_counter()
    for seq in range(n):
        if rate:
            due = t0 + seq / rate
            now = time.perf_counter()
            if due > now:
                await asyncio.sleep(due - now)
            elif now - due > 0.001:
                late += 1
        else:
            await asyncio.sleep(pause * (1 + 4 * rng.random()))
        s0 = time.perf_counter()
        if kind == "raw":
            send(seq)
        else:
            await q.send(_stamped(seq))
        took.append(time.perf_counter() - s0)
        committed.append(time.time())
    seconds = time.perf_counter() - t0
    if kind == "raw":
        conn.close()
    else:
        await broker.close()
    took.sort()
    return {
        "sent": n,
        "seconds": seconds,
        "late": late,
        "send_p99_ms": took[int(0.99 * (len(took) - 1))] * 1e3,
        "send_max_ms": took[-1] * 1e3,
        "committed": committed,
    }


async def _fairq_poll_consumer(path: str, n: int) -> dict[str, Any]:
    broker = await fairq.connect(_url(path))
    q = broker.queue(QUEUE)
    got: dict[int, float] = {}
    print("ready", flush=True)
    while len(got) < n:
        msgs = await q.receive(max_messages=10, wait=10.0)
        if not msgs:
            break
        now = time.time()
        for m in msgs:
            got[orjson.loads(m.body)["seq"]] = now
        await q.ack_batch([m.receipt for m in msgs])
    await broker.close()
    return {"received": got}


async def _fairq_worker_consumer(path: str, n: int) -> dict[str, Any]:
    broker = await fairq.connect(_url(path))
    worker = fairq.Worker(broker, concurrency=WORKER_CONCURRENCY, handle_signals=False, grace=5.0)
    lat: list[float] = []
    done = asyncio.Event()

    @worker.queue(QUEUE, concurrency=WORKER_CONCURRENCY)
    async def handle(msg: fairq.Received) -> None:
        lat.append(_latency(msg.body))
        if len(lat) >= n:
            done.set()

    running = asyncio.create_task(worker.run())
    await asyncio.sleep(0.1)
    print("ready", flush=True)
    cpu0, t0 = _cpu(), time.perf_counter()
    with_timeout = max(30.0, 5 * n / RATE)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), with_timeout)
    cpu = (_cpu() - cpu0) / (time.perf_counter() - t0)
    worker.stop()
    await asyncio.wait_for(running, 30)
    await broker.close()
    return {"latencies": lat, "cpu_share": cpu}


def _raw_consumer(path: str, n: int, poll: float) -> dict[str, Any]:
    conn = raw_open(path)
    rng = random.Random()
    lat: list[float] = []
    print("ready", flush=True)
    deadline = time.monotonic() + max(30.0, 5 * n / RATE)
    while len(lat) < n and time.monotonic() < deadline:
        now = time.time()
        lease = rng.getrandbits(62)
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(
            "UPDATE q SET visible_at = ?, lease = ? WHERE id IN (SELECT id FROM q WHERE "
            "visible_at <= ? ORDER BY id LIMIT 10) RETURNING id, body",
            (now + 30.0, lease, now),
        ).fetchall()
        conn.execute("COMMIT")
        if not rows:
            time.sleep(poll)
            continue
        got = time.time()
        lat += [got - float(orjson.loads(body)["t"]) for _, body in rows]
        ids = [r[0] for r in rows]
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            f"DELETE FROM q WHERE id IN ({','.join('?' * len(ids))}) AND lease = ?",
            (*ids, lease),
        )
        conn.execute("COMMIT")
    conn.close()
    return {"latencies": lat}


async def _idle_consumer(path: str, seconds: float) -> dict[str, Any]:
    broker = await fairq.connect(_url(path))
    q = broker.queue(QUEUE)
    await q.receive(wait=0.2)  # warm up: imports, statements, the watch
    cpu0, t0 = _cpu(), time.perf_counter()
    got = await q.receive(wait=seconds)
    wall = time.perf_counter() - t0
    cpu = _cpu() - cpu0
    await broker.close()
    return {"wall": wall, "cpu": cpu, "cpu_share": cpu / wall, "got": len(got)}


# -- what bench.queues calls ---------------------------------------------------------------
async def _declare(path: str) -> None:
    async with await fairq.connect(_url(path)) as broker:
        await broker.declare_queue(QUEUE)


def wakeup(path: str, n: int) -> list[float]:
    """Wake-up latencies (s) of ``n`` single sends, each waking a consumer in another
    process: from the moment ``send`` returned (the commit is done) in the producer to the
    moment ``receive`` returned in the consumer."""
    asyncio.run(_declare(path))
    consumer = _spawn("poll-consumer", path, str(n))
    _wait_ready(consumer)
    producer = _spawn("producer", "fairq", path, str(n), "0", "0.005")
    _wait_ready(producer)
    committed = _result(producer, 120 + n * 0.05)["committed"]
    got = _result(consumer, 60)["received"]
    return [max(0.0, got[str(seq)] - t) for seq, t in enumerate(committed) if str(seq) in got]


def steady(kind: str, path: str, n: int, rate: float = RATE) -> dict[str, Any]:
    """End-to-end latencies at a steady ``rate`` from a producer process: ``kind`` fairq
    (a Worker consumes) or raw (the minimal raw loop polls every 1 ms)."""
    if kind == "raw":
        raw_open(path).close()
        consumer = _spawn("raw-consumer", path, str(n), "0.001")
    else:
        asyncio.run(_declare(path))
        consumer = _spawn("worker-consumer", path, str(n))
    _wait_ready(consumer)
    producer = _spawn("producer", kind, path, str(n), str(rate), "0")
    _wait_ready(producer)
    sent = _result(producer, 120 + n / rate * 3)
    got = _result(consumer, 120)
    got["producer"] = sent
    return got


def idle(path: str, seconds: float) -> dict[str, Any]:
    """The CPU share of a process long-polling an empty queue for ``seconds``."""
    asyncio.run(_declare(path))
    proc = _spawn("idle-consumer", path, str(seconds))
    return _result(proc, seconds + 60)


async def _worker_drain(path: str, bodies: list[bytes]) -> dict[int, float]:
    """Drain rates on backlogs of ``len(bodies)``: ``{100: Worker(concurrency=100), 16:
    Worker(concurrency=16), 0: receive(100)+ack_batch}``."""
    n = len(bodies)
    rates: dict[int, float] = {}
    for concurrency in (100, 16, 0):
        async with await fairq.connect(_url(f"{path}-{concurrency}.db")) as broker:
            q = await broker.declare_queue(QUEUE)
            for i in range(0, n, 1000):
                await q.send_batch([fairq.Outgoing(b) for b in bodies[i : i + 1000]])
            gc.collect()
            if concurrency:
                worker = fairq.Worker(
                    broker, concurrency=concurrency, handle_signals=False, grace=5.0
                )
                count = 0
                drained = asyncio.Event()

                @worker.queue(QUEUE, concurrency=concurrency)
                async def handle(msg: fairq.Received, drained: asyncio.Event = drained) -> None:
                    nonlocal count
                    count += 1
                    if count == n:
                        drained.set()

                t0 = time.perf_counter()
                running = asyncio.create_task(worker.run())
                await asyncio.wait_for(drained.wait(), 600)
                seconds = time.perf_counter() - t0
                worker.stop()
                await asyncio.wait_for(running, 30)
            else:
                t0 = time.perf_counter()
                got = 0
                while got < n:
                    msgs = await q.receive(max_messages=100)
                    await q.ack_batch([m.receipt for m in msgs])
                    got += len(msgs)
                seconds = time.perf_counter() - t0
            stats = await q.stats()
            if stats.depth:
                raise RuntimeError(f"drain {concurrency}: {stats.depth} messages left")
            rates[concurrency] = n / seconds
    return rates


def worker_drain(path: str, bodies: list[bytes]) -> dict[int, float]:
    return asyncio.run(_worker_drain(path, bodies))


def main(argv: list[str]) -> int:
    role, *args = argv
    result: dict[str, Any]
    if role == "producer":
        kind, path, n, rate, pause = args
        result = asyncio.run(_producer(kind, path, int(n), float(rate), float(pause)))
    elif role == "poll-consumer":
        result = asyncio.run(_fairq_poll_consumer(args[0], int(args[1])))
    elif role == "worker-consumer":
        result = asyncio.run(_fairq_worker_consumer(args[0], int(args[1])))
    elif role == "raw-consumer":
        result = _raw_consumer(args[0], int(args[1]), float(args[2]))
    elif role == "idle-consumer":
        result = asyncio.run(_idle_consumer(args[0], float(args[1])))
    else:
        print(f"unknown role {role!r}", file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main(sys.argv[1:]))
