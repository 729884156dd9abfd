"""Queue benchmarks on Redis: ``python -m bench.queues --backend redis``.

Everything runs against a private redis-server this script starts (no persistence, on a
free loopback port of 16400-16499), flushed between systems, so the shared Redis is never
touched and every system meets the same empty server. ~200-byte JSON bodies, as in the
SQLite run (``bench.queues.make_bodies``).

* **raw Streams**: redis-py alone — ``XADD`` pipelined in batches of 100, then
  ``XREADGROUP COUNT 100`` + ``XACK`` — the engine yardstick.
* **fairq**: ``send_batch`` of 100, then ``receive(100)`` + ``ack_batch``.
* **drain**: N messages enqueued beforehand, then one worker with a no-op handler drains
  them: fairq's ``Worker``, Dramatiq (Redis broker, its ``Worker``), RQ (``SimpleWorker``,
  burst), arq (``poll_delay=0.01, max_jobs=100``, burst), Celery (``--pool=solo``, acks
  late, a worker process) and taskiq (``RedisStreamBroker``, a worker process), each in its
  normal single-process set-up. Celery and taskiq run as their own CLI's worker process and
  count done jobs in a Redis counter (one ``INCR`` per job, noted in the table).
* **latency**: a producer sending 1,000 msgs/s steadily for ``--latency-seconds``, a fairq
  worker in another process; p50/p99 of send-to-handler latency.
* **wake-up**: a consumer process long-polls an empty queue; the time from ``send`` returning
  to ``receive`` returning, over 50 sends.
* **memory**: ``INFO memory`` ``used_memory`` before and after 100,000 sends of a 200-byte
  body, and after draining them.

Each figure is the median of ``--runs`` runs; results go to ``bench/results/queues-redis.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

import fairq

from .queues import RESULTS, ROOT, Measured, make_bodies, percentile, stamped_body

sys.path.insert(0, str(ROOT / "tests"))
from redis_servers import RedisServer

RAW, FAIRQ = "raw redis-py Streams", "fairq"
DRAMATIQ, RQ, ARQ, CELERY, TASKIQ = "dramatiq", "rq", "arq", "celery", "taskiq"
PEERS = (DRAMATIQ, RQ, ARQ, CELERY, TASKIQ)
SEND, RECV, DRAIN = "send", "receive+ack", "worker drain (no-op handler)"
STREAM, GROUP = "bench-stream", "bench-group"


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- raw redis-py Streams ------------------------------------------------------------------
def raw_phases(port: int, bodies: list[bytes]) -> tuple[Measured, Measured]:
    r = redis.Redis(port=port)
    r.delete(STREAM)
    r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    t0 = time.perf_counter()
    for i in range(0, len(bodies), 100):
        with r.pipeline(transaction=False) as p:
            for b in bodies[i : i + 100]:
                p.xadd(STREAM, {"b": b})
            p.execute()
    send = Measured(len(bodies), time.perf_counter() - t0)
    got = 0
    t0 = time.perf_counter()
    while got < len(bodies):
        res = r.xreadgroup(GROUP, "c1", {STREAM: ">"}, count=100)
        if not res:
            break
        ids = [mid for mid, _ in res[0][1]]
        r.xack(STREAM, GROUP, *ids)
        got += len(ids)
    recv = Measured(got, time.perf_counter() - t0)
    r.delete(STREAM)
    r.close()
    return send, recv


# -- fairq ---------------------------------------------------------------------------------
async def _fairq_phases(url: str, bodies: list[bytes]) -> tuple[Measured, Measured]:
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("bench")
        batches = [
            [fairq.Outgoing(b) for b in bodies[i : i + 100]] for i in range(0, len(bodies), 100)
        ]
        t0 = time.perf_counter()
        for batch in batches:
            await q.send_batch(batch)
        send = Measured(len(bodies), time.perf_counter() - t0)
        got = 0
        t0 = time.perf_counter()
        while got < len(bodies):
            msgs = await q.receive(max_messages=100)
            if not msgs:
                break
            await q.ack_batch([m.receipt for m in msgs])
            got += len(msgs)
        recv = Measured(got, time.perf_counter() - t0)
        await broker.delete_queue("bench")
    return send, recv


async def _fairq_drain(url: str, bodies: list[bytes]) -> Measured:
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("drain")
        for i in range(0, len(bodies), 100):
            await q.send_batch([fairq.Outgoing(b) for b in bodies[i : i + 100]])
        done = asyncio.Event()
        count = 0
        worker = fairq.Worker(broker, concurrency=100, handle_signals=False, poll_wait=0.5)

        @worker.queue("drain", concurrency=100)
        async def noop(msg: fairq.Received) -> None:
            nonlocal count
            count += 1
            if count >= len(bodies):
                done.set()

        t0 = time.perf_counter()
        task = asyncio.create_task(worker.run())
        await asyncio.wait_for(done.wait(), 600)
        seconds = time.perf_counter() - t0
        worker.stop()
        await task
        await broker.delete_queue("drain")
    return Measured(len(bodies), seconds, note="Worker(concurrency=100), async no-op")


# -- peers ---------------------------------------------------------------------------------
def dramatiq_drain(port: int, n: int) -> Measured:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=f"redis://127.0.0.1:{port}/0")
    dramatiq.set_broker(broker)
    done = threading.Event()
    count = [0]
    lock = threading.Lock()

    @dramatiq.actor(max_retries=0, queue_name="bench")
    def noop(i: int) -> None:
        with lock:
            count[0] += 1
            if count[0] >= n:
                done.set()

    for i in range(n):
        noop.send(i)
    worker = dramatiq.Worker(broker, worker_threads=8)
    t0 = time.perf_counter()
    worker.start()
    done.wait(600)
    seconds = time.perf_counter() - t0
    worker.stop()
    broker.close()
    return Measured(count[0], seconds, note="RedisBroker, Worker(worker_threads=8)")


def rq_drain(port: int, n: int) -> Measured:
    from rq import Queue, SimpleWorker

    from . import peer_jobs

    conn = redis.Redis(port=port)
    q = Queue("bench", connection=conn)
    q.enqueue_many([Queue.prepare_data(peer_jobs.noop, (i,), result_ttl=0) for i in range(n)])
    worker = SimpleWorker([q], connection=conn)
    t0 = time.perf_counter()
    worker.work(burst=True, logging_level="WARNING")
    seconds = time.perf_counter() - t0
    return Measured(n - len(q), seconds, note="SimpleWorker, burst")


def arq_drain(port: int, n: int) -> Measured:
    from arq import create_pool
    from arq.connections import RedisSettings
    from arq.worker import Worker, func

    settings = RedisSettings(port=port)
    count = [0]

    async def noop(ctx: dict[str, Any], i: int) -> None:
        count[0] += 1

    async def run() -> float:
        pool = await create_pool(settings)
        for i in range(n):
            await pool.enqueue_job("noop", i)
        await pool.aclose()
        worker = Worker(
            functions=[func(noop, name="noop")],
            redis_settings=settings,
            burst=True,
            poll_delay=0.01,
            max_jobs=100,
            keep_result=0,
            handle_signals=False,
        )
        t0 = time.perf_counter()
        await worker.async_run()
        seconds = time.perf_counter() - t0
        await worker.close()
        return seconds

    seconds = asyncio.run(run())
    return Measured(count[0], seconds, note="poll_delay=0.01, max_jobs=100, burst")


def _process_drain(
    port: int, n: int, enqueue: Callable[[], None], command: list[str], note: str
) -> Measured:
    """Enqueue, start a worker process, time until the jobs' Redis counter reaches n."""
    r = redis.Redis(port=port)
    r.delete("bench:done")
    enqueue()
    env = dict(os.environ, BENCH_REDIS_PORT=str(port), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT
    )
    try:
        # the clock starts when the first job is done (process start-up is not counted)
        deadline = time.monotonic() + 120
        while int(r.get("bench:done") or 0) == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        t0 = time.perf_counter()
        start = int(r.get("bench:done") or 0)
        deadline = time.monotonic() + 600
        while int(r.get("bench:done") or 0) < n and time.monotonic() < deadline:
            time.sleep(0.002)
        seconds = time.perf_counter() - t0
        done = int(r.get("bench:done") or 0) - start
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    r.close()
    return Measured(done, seconds, note=note)


def celery_drain(port: int, n: int) -> Measured:
    os.environ["BENCH_REDIS_PORT"] = str(port)
    from . import peer_celery

    def enqueue() -> None:
        for i in range(n):
            peer_celery.noop.delay(i)

    return _process_drain(
        port,
        n,
        enqueue,
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench.peer_celery",
            "worker",
            "--pool=solo",
            "--loglevel=WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        "worker --pool=solo, acks_late; +1 INCR per job to count",
    )


def taskiq_drain(port: int, n: int) -> Measured:
    os.environ["BENCH_REDIS_PORT"] = str(port)
    from . import peer_taskiq

    async def enqueue_async() -> None:
        await peer_taskiq.broker.startup()
        for i in range(n):
            await peer_taskiq.noop.kiq(i)
        await peer_taskiq.broker.shutdown()

    return _process_drain(
        port,
        n,
        lambda: asyncio.run(enqueue_async()),
        [sys.executable, "-m", "taskiq", "worker", "bench.peer_taskiq:broker", "--workers", "1"],
        "RedisStreamBroker, 1 worker process; +1 INCR per job to count",
    )


# -- latency, wake-up, memory ----------------------------------------------------------------
CHILD = """
import asyncio, sys, time, orjson, fairq, os
POLL = float(os.environ.get("BENCH_POLL", "1.0"))
async def main(url, mode, seconds):
    async with await fairq.connect(url) as broker:
        q = broker.queue(mode)
        if mode == "wake":
            print("ready", flush=True)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for m in await q.receive(wait=2):
                    print("got", time.time() - float(m.body), flush=True)
                    await m.ack()
            return
        worker = fairq.Worker(broker, concurrency=32, handle_signals=False, poll_wait=POLL)
        seen = []  # printed at the end: a full stdout pipe would stall the worker
        @worker.queue(mode, concurrency=32)
        async def h(m):
            seen.append(time.time() - float(orjson.loads(m.body)["t"]))
        print("ready", flush=True)
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(seconds)
        worker.stop(); await task
        print(chr(10).join(f"lat {x}" for x in seen), flush=True)
asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
"""


def _child(url: str, mode: str, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, mode, str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("ready")
    return proc


async def _steady(url: str, rate: float, seconds: float) -> list[float]:
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("steady")
        child = _child(url, "steady", seconds + 3)
        await asyncio.sleep(0.5)
        loop = asyncio.get_running_loop()
        start = loop.time()
        i = 0
        while loop.time() - start < seconds:
            due = start + i / rate
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await q.send(stamped_body(i))
            i += 1
        out, _ = await asyncio.to_thread(child.communicate)
        await broker.delete_queue("steady")
    return [float(line.split()[1]) for line in out.splitlines() if line.startswith("lat")]


async def _wake(url: str, n: int = 50) -> list[float]:
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("wake")
        child = _child(url, "wake", n * 0.2 + 5)
        await asyncio.sleep(0.5)
        for _ in range(n):
            await q.send(repr(time.time()))
            await asyncio.sleep(0.2)
        out, _ = await asyncio.to_thread(child.communicate)
        await broker.delete_queue("wake")
    return [float(line.split()[1]) for line in out.splitlines() if line.startswith("got")]


async def _memory(url: str, port: int, n: int = 100_000) -> dict[str, float]:
    r = redis.Redis(port=port)
    body = b"x" * 200
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("mem")
        await q.send(b"warm")
        (m,) = await q.receive()
        await m.ack()
        base = int(r.info("memory")["used_memory"])
        for _ in range(0, n, 1000):
            await q.send_batch([fairq.Outgoing(body)] * 1000)
        full = int(r.info("memory")["used_memory"])
        while msgs := await q.receive(max_messages=1000):
            await q.ack_batch([m.receipt for m in msgs])
        drained = int(r.info("memory")["used_memory"])
    r.close()
    return {
        "baseline_bytes": base,
        "queued_bytes": full,
        "drained_bytes": drained,
        "bytes_per_message": (full - base) / n,
        "after_drain_minus_baseline": drained - base,
    }


# -- the run -------------------------------------------------------------------------------
def run(n: int, runs: int, systems: tuple[str, ...], latency_seconds: float) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="fairq-bench-redis-"))
    server = RedisServer(work, None, "--appendonly", "no").start()
    port = server.port
    url = f"redis://127.0.0.1:{port}/0?prefix=b:"
    flush = redis.Redis(port=port)
    bodies = make_bodies(n)
    rates: dict[tuple[str, str], list[float]] = {}
    notes: dict[tuple[str, str], str] = {}

    def add(system: str, phase: str, m: Measured) -> None:
        rates.setdefault((system, phase), []).append(m.rate)
        if m.note:
            notes[(system, phase)] = m.note
        _say(f"  {system:22s} {phase:30s} {m.rate:>10,.0f} msgs/s ({m.n:,} in {m.seconds:.2f} s)")

    drains: dict[str, Callable[[], Measured]] = {
        FAIRQ: lambda: asyncio.run(_fairq_drain(url, bodies)),
        DRAMATIQ: lambda: dramatiq_drain(port, n),
        RQ: lambda: rq_drain(port, n),
        ARQ: lambda: arq_drain(port, n),
        CELERY: lambda: celery_drain(port, n),
        TASKIQ: lambda: taskiq_drain(port, n),
    }
    try:
        for r in range(1, runs + 1):
            _say(f"run {r}/{runs}")
            flush.flushall()
            s, v = raw_phases(port, bodies)
            add(RAW, SEND, s)
            add(RAW, RECV, v)
            flush.flushall()
            s, v = asyncio.run(_fairq_phases(url, bodies))
            add(FAIRQ, SEND, s)
            add(FAIRQ, RECV, v)
            for system, drain in drains.items():
                if system not in systems:
                    continue
                flush.flushall()
                try:
                    add(system, DRAIN, drain())
                except Exception as exc:  # a peer that fails is reported, not fatal
                    _say(f"  {system} failed: {exc!r}")
        flush.flushall()
        latencies = asyncio.run(_steady(url, 1000.0, latency_seconds))
        flush.flushall()
        wake = asyncio.run(_wake(url))
        flush.flushall()
        memory = asyncio.run(_memory(url, port))
    finally:
        flush.close()
        server.stop()
    results = []
    for (system, phase), values in rates.items():
        results.append(
            {
                "system": system,
                "phase": phase,
                "batch": 100 if phase != DRAIN else None,
                "n": n,
                "msgs_per_s": statistics.median(values),
                "runs": values,
                "note": notes.get((system, phase), ""),
            }
        )

    def med(system: str, phase: str) -> float | None:
        v = rates.get((system, phase))
        return statistics.median(v) if v else None

    best_peer = max(
        ((p, med(p, DRAIN)) for p in PEERS if med(p, DRAIN)), key=lambda x: x[1] or 0, default=None
    )
    e2e_runs = [
        _e2e(fs, fr) / _e2e(rs, rr)
        for fs, fr, rs, rr in zip(
            rates.get((FAIRQ, SEND), []),
            rates.get((FAIRQ, RECV), []),
            rates.get((RAW, SEND), []),
            rates.get((RAW, RECV), []),
            strict=False,
        )
    ]
    ratios = {
        "send_vs_raw": (med(FAIRQ, SEND) or 0) / (med(RAW, SEND) or 1),
        "receive_ack_vs_raw": (med(FAIRQ, RECV) or 0) / (med(RAW, RECV) or 1),
        "end_to_end_vs_raw": _e2e(med(FAIRQ, SEND), med(FAIRQ, RECV))
        / _e2e(med(RAW, SEND), med(RAW, RECV)),
        # each run's own ratio (fairq and the raw loop minutes apart, not runs apart),
        # then their median: what a loaded, shared machine disturbs least
        "end_to_end_vs_raw_per_run": e2e_runs,
        "end_to_end_vs_raw_median_of_runs": statistics.median(e2e_runs) if e2e_runs else None,
        "drain_vs_best_peer": (med(FAIRQ, DRAIN) or 0) / best_peer[1] if best_peer else None,
        "best_peer": best_peer[0] if best_peer else None,
    }
    return {
        "n": n,
        "runs": runs,
        "redis": redis.Redis.__module__,
        "results": results,
        "ratios": ratios,
        "steady_1000_per_s": {
            "n": len(latencies),
            "p50_ms": percentile(latencies, 0.5) * 1000 if latencies else None,
            "p99_ms": percentile(latencies, 0.99) * 1000 if latencies else None,
        },
        "wake_up_ms": {
            "n": len(wake),
            "p50": percentile(wake, 0.5) * 1000 if wake else None,
            "p99": percentile(wake, 0.99) * 1000 if wake else None,
        },
        "memory": memory,
    }


def _e2e(send: float | None, recv: float | None) -> float:
    """Messages per second end to end (send then receive+ack, one after the other)."""
    if not send or not recv:
        return 0.0
    return 1.0 / (1.0 / send + 1.0 / recv)


def main(n: int, runs: int, systems: tuple[str, ...], latency_seconds: float) -> int:
    doc = run(n, runs, systems, latency_seconds)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "queues-redis.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(
        json.dumps(
            {k: doc[k] for k in ("ratios", "steady_1000_per_s", "wake_up_ms", "memory")}, indent=2
        )
    )
    for r in doc["results"]:
        print(f"{r['system']:22s} {r['phase']:30s} {r['msgs_per_s']:>10,.0f}  {r['note']}")
    _say(f"results written to {path}")
    return 0


def plot(doc: dict[str, Any], path: Path) -> None:
    """Bars of the run's medians: send and receive+ack beside raw Streams, and the worker
    drains beside the peers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {(r["system"], r["phase"]): r["msgs_per_s"] for r in doc["results"]}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [SEND, RECV]
    for i, system in enumerate((RAW, FAIRQ)):
        values = [rows.get((system, p), 0) for p in labels]
        left.bar([x + i * 0.4 for x in range(len(labels))], values, width=0.4, label=system)
    left.set_xticks(
        [x + 0.2 for x in range(len(labels))], ["send (batch 100)", "receive+ack (100)"]
    )
    left.set_ylabel("msgs/s (median)")
    left.set_title("fairq on Redis beside raw redis-py Streams")
    left.legend()
    systems = [s for s in (FAIRQ, *PEERS) if (s, DRAIN) in rows]
    right.bar(systems, [rows[(s, DRAIN)] for s in systems], color="tab:green")
    right.set_ylabel("msgs/s (median)")
    right.set_title("one worker, no-op handler, Redis broker")
    right.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(doc: dict[str, Any]) -> str:
    """The run as Markdown (for docs/benchmarks.md)."""
    rows = {(r["system"], r["phase"]): r for r in doc["results"]}
    raw = {p: rows[(RAW, p)]["msgs_per_s"] for p in (SEND, RECV) if (RAW, p) in rows}
    drains = [rows[(s, DRAIN)] for s in (FAIRQ, *PEERS) if (s, DRAIN) in rows]
    best = max((r["msgs_per_s"] for r in drains if r["system"] != FAIRQ), default=None)
    lines = [
        "| system | phase | msgs/s (median) | runs | vs raw Streams | vs best peer | notes |",
        "|---|---|--:|---|--:|--:|---|",
    ]
    for r in doc["results"]:
        vs_raw = r["msgs_per_s"] / raw[r["phase"]] if r["phase"] in raw else None
        vs_peer = r["msgs_per_s"] / best if r["phase"] == DRAIN and best else None
        runs = ", ".join(f"{v:,.0f}" for v in r["runs"])
        lines.append(
            f"| {r['system']} | {r['phase']} | {r['msgs_per_s']:,.0f} | {runs} | "
            f"{'—' if vs_raw is None else f'{vs_raw:.2f}'} | "
            f"{'—' if vs_peer is None else f'{vs_peer:.2f}'} | {r['note']} |"
        )
    return "\n".join(lines)
