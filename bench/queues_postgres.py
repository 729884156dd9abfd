"""Queue benchmarks on PostgreSQL: fairq beside a raw psycopg ``FOR UPDATE SKIP LOCKED``
loop, PGQueuer (its QueueManager, no-op entrypoint, batch enqueue) and procrastinate (its
worker), on the same server and database, with the same ~200-byte bodies.

    python -m bench.queues --backend postgres              # N=20,000, 3 runs, latency
    python -m bench.queues --backend postgres --quick      # N=2,000, 1 run
    python -m bench.queues --backend postgres --soak       # the 20-minute soak (not in CI)

Options: ``--pg-url`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``; a
database ``fairq_bench`` is made beside it and dropped at the end), or ``--own-cluster``
(a throw-away cluster with the stock settings, initdb'd on a free port of
``--cluster-ports``, default 15460-15469, removed at the end), ``--n``, ``--runs``,
``--rate`` and ``--latency-seconds`` (steady-rate latency), ``--soak-minutes``,
``--hold-minutes``. Phases:

* **send** — N messages in batches of 100 (one batch per call/statement);
* **receive+ack** — drain them in batches of 100 (fairq: receive 100 then ack_batch);
* **end to end** — N / (send time + receive+ack time): the acceptance figure;
* **worker** — N sent in batches, then the system's own worker runs no-op handlers until
  all are done (fairq's ``Worker``, PGQueuer's ``QueueManager``, procrastinate's worker);
* **latency** — ``--rate`` msgs/s for ``--latency-seconds`` from a producer process of its
  own (every 5 ms, what fell due goes as one batch; several batches in flight when one is
  slow), a consumer here (fairq: receive(wait) + ack_batch, or a Worker; PGQueuer: its
  QueueManager); p50/p99 from each message's scheduled send time to its consumer.

Each figure is the median of ``--runs`` runs, systems interleaved per run (every other
run in reverse order); ratios are to the raw loop and to the best peer of the same run.
Results: ``bench/results/queues-postgres.json`` (``-quick``), the soak in
``queues-postgres-soak.json``; ``python -m bench.plot_postgres`` draws them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

import fairq

from .queues import _PAD_STAMPED, Measured, _json, machine, make_bodies, percentile, source

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parent.parent
BATCH = 100
RAW, FAIRQ, FAIRQ_WORKER, PGQ, PROC = (
    "raw psycopg",
    "fairq",
    "fairq Worker",
    "PGQueuer",
    "procrastinate",
)
PEERS = (PGQ, PROC)
PGQ_WORKERS, PGQ_BATCH = 4, 10  # as in PGQueuer's own benchmark (5 x 10 there)
SEND, RECV, E2E, WORKER, LAT = "send", "receive+ack", "end to end", "worker", "latency"


def _db_url(server: str, db: str) -> str:
    parts = urlsplit(server)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, ""))


# -- raw psycopg: the engine yardstick -----------------------------------------------------
async def raw_phases(db: str, bodies: list[bytes]) -> tuple[Measured, Measured]:
    """INSERT ... unnest() per batch; DELETE ... WHERE id IN (SELECT ... FOR UPDATE SKIP
    LOCKED LIMIT 100) RETURNING per batch — the least a SKIP LOCKED queue must do."""
    async with await psycopg.AsyncConnection.connect(db, autocommit=True) as c:
        await c.execute("DROP TABLE IF EXISTS raw_queue")
        await c.execute(
            "CREATE TABLE raw_queue (id bigserial PRIMARY KEY, queue text NOT NULL, "
            "payload bytea NOT NULL)"
        )
        t0 = time.perf_counter()
        for i in range(0, len(bodies), BATCH):
            await c.execute(
                "INSERT INTO raw_queue (queue, payload) SELECT 'q', unnest(%s::bytea[])",
                (bodies[i : i + BATCH],),
            )
        send = time.perf_counter() - t0
        got = 0
        t0 = time.perf_counter()
        while True:
            cur = await c.execute(
                "DELETE FROM raw_queue WHERE id IN (SELECT id FROM raw_queue WHERE queue = 'q' "
                "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING payload",
                (BATCH,),
            )
            rows = await cur.fetchall()
            if not rows:
                break
            got += len(rows)
        recv = time.perf_counter() - t0
        assert got == len(bodies)
        await c.execute("DROP TABLE raw_queue")
    return Measured(len(bodies), send), Measured(len(bodies), recv)


# -- fairq ---------------------------------------------------------------------------------
async def fairq_phases(url: str, bodies: list[bytes]) -> tuple[Measured, Measured]:
    async with await fairq.connect(url) as b:
        await b.delete_queue("bench")
        q = await b.declare_queue("bench", dead_letter=None, dedup_window=0)
        batches = [
            [fairq.Outgoing(x) for x in bodies[i : i + BATCH]] for i in range(0, len(bodies), BATCH)
        ]
        t0 = time.perf_counter()
        for batch in batches:
            await q.send_batch(batch)
        send = time.perf_counter() - t0
        got = 0
        t0 = time.perf_counter()
        while msgs := await q.receive(max_messages=BATCH):
            await q.ack_batch([m.receipt for m in msgs])
            got += len(msgs)
        recv = time.perf_counter() - t0
        assert got == len(bodies), got
        await b.delete_queue("bench")
    return Measured(len(bodies), send), Measured(len(bodies), recv)


async def fairq_worker(url: str, bodies: list[bytes]) -> Measured:
    async with await fairq.connect(url) as b:
        await b.delete_queue("bench-w")
        q = await b.declare_queue("bench-w", dead_letter=None, dedup_window=0)
        for i in range(0, len(bodies), BATCH):
            await q.send_batch([fairq.Outgoing(x) for x in bodies[i : i + BATCH]])
        done = asyncio.Event()
        count = 0
        worker = fairq.Worker(b, concurrency=64, handle_signals=False, poll_wait=0.5)

        @worker.queue("bench-w", concurrency=64)
        async def noop(msg: fairq.Received) -> None:
            nonlocal count
            count += 1
            if count >= len(bodies):
                done.set()

        t0 = time.perf_counter()
        task = asyncio.create_task(worker.run())
        await done.wait()
        for _ in range(10_000):  # the last acks land
            if not (await q.stats()).depth:
                break
            await asyncio.sleep(0.005)
        seconds = time.perf_counter() - t0
        worker.stop()
        await task
        await b.delete_queue("bench-w")
    return Measured(len(bodies), seconds, note="Worker(concurrency=64), no-op handler")


# -- latency at a steady rate, across processes ---------------------------------------------
#: the producer's tick: every TICK s it sends what fell due since the last tick, as one
#: batch (one statement), each message stamped with its own scheduled time
TICK = 0.005


class _Latencies:
    """What the consumer measured, and a way to wait until it has them all."""

    def __init__(self) -> None:
        self.values: list[float] = []
        self._want = float("inf")
        self._all = asyncio.Event()

    def add(self, values: list[float]) -> None:
        self.values.extend(values)
        if len(self.values) >= self._want:
            self._all.set()

    async def wait_for(self, n: int, seconds: float = 10.0) -> None:
        self._want = n
        self.add([])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._all.wait(), seconds)


async def paced(
    send_batch: Callable[[list[bytes]], Awaitable[Any]], rate: float, seconds: float
) -> int:
    """Send ``rate`` msgs/s for ``seconds``: every :data:`TICK` what fell due since the last
    tick goes in one batch, each message stamped with the time it was due (so a late
    producer shows as latency, never as a lower rate). Batches overlap when one takes
    longer than a tick (several connections), so the schedule holds."""
    interval = 1.0 / rate
    total = int(rate * seconds)
    wall0, start = time.time(), time.perf_counter()
    sent = 0
    pending: set[asyncio.Task[Any]] = set()
    while sent < total:
        due = min(total, int((time.perf_counter() - start) / interval) + 1)
        if due > sent:
            batch = [_json(j, wall0 + j * interval, _PAD_STAMPED) for j in range(sent, due)]
            task = asyncio.create_task(send_batch(batch))
            pending.add(task)
            task.add_done_callback(pending.discard)
            sent = due
        await asyncio.sleep(TICK)
    await asyncio.gather(*pending)
    return sent


async def _produce(system: str, url: str, rate: float, seconds: float) -> int:
    """The producer process's work (``--produce``): fairq or PGQueuer batches on schedule."""
    if system == "pgqueuer":
        from pgqueuer.queries import Queries

        conns = [await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(4)]
        free: asyncio.Queue[Any] = asyncio.Queue()
        for c in conns:
            free.put_nowait(Queries.from_psycopg_connection(c))

        async def pgq_send(batch: list[bytes]) -> None:
            queries = await free.get()
            try:
                await queries.enqueue(["noop"] * len(batch), list(batch), [0] * len(batch))
            finally:
                free.put_nowait(queries)

        n = await paced(pgq_send, rate, seconds)
        for c in conns:
            await c.close()
        return n
    async with await fairq.connect(url) as b:
        q = b.queue(system)  # the queue's name

        async def send(batch: list[bytes]) -> None:
            await q.send_batch([fairq.Outgoing(x) for x in batch])

        return await paced(send, rate, seconds)


async def _producer_process(system: str, url: str, rate: float, seconds: float) -> int:
    """Run the producer in a process of its own; the number of messages it sent."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.queues_postgres",
        "--produce",
        system,
        "--produce-url",
        url,
        "--rate",
        str(rate),
        "--latency-seconds",
        str(seconds),
        stdout=asyncio.subprocess.PIPE,
        cwd=str(ROOT),
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the producer process failed ({proc.returncode})")
    return int(out.decode().split()[-1])


async def fairq_latency(url: str, rate: float, seconds: float, worker: bool) -> Measured:
    """A producer process sends on schedule (:func:`paced`); this process consumes with
    receive + ack_batch, or with a Worker; latency from each message's due time to the
    moment its consumer has it."""
    async with await fairq.connect(url) as consumer:
        name = "bench-lat-w" if worker else "bench-lat"
        await consumer.delete_queue(name)
        await consumer.declare_queue(name, dead_letter=None, dedup_window=0)
        lat = _Latencies()
        stop = asyncio.Event()
        if worker:
            w = fairq.Worker(consumer, concurrency=32, handle_signals=False, poll_wait=1.0)

            @w.queue(name, concurrency=32)
            async def handle(msg: fairq.Received) -> None:
                lat.add([time.time() - float(msg.json()["t"])])

            task = asyncio.create_task(w.run())
        else:
            cq = consumer.queue(name)

            async def consume() -> None:
                while not stop.is_set():
                    msgs = await cq.receive(max_messages=BATCH, wait=0.5)
                    now = time.time()
                    lat.add([now - float(m.json()["t"]) for m in msgs])
                    if msgs:
                        await cq.ack_batch([m.receipt for m in msgs])

            task = asyncio.create_task(consume())
        await asyncio.sleep(0.5)
        sent = await _producer_process(name, url, rate, seconds)
        await lat.wait_for(sent)
        stop.set()
        if worker:
            w.stop()
        await task
        await consumer.delete_queue(name)
    note = "Worker(concurrency=32)" if worker else "receive(wait=0.5, max 100) + ack_batch"
    return Measured(sent, seconds, latencies=lat.values, note=f"producer process, {note}")


# -- PGQueuer ------------------------------------------------------------------------------
async def _pgq_queries(db: str) -> tuple[Any, Any]:
    from pgqueuer.queries import Queries

    conn = await psycopg.AsyncConnection.connect(db, autocommit=True)
    queries = Queries.from_psycopg_connection(conn)
    with contextlib.suppress(Exception):
        await queries.uninstall()
    await queries.install()
    return conn, queries


async def pgq_phases(db: str, bodies: list[bytes]) -> tuple[Measured, Measured]:
    """Batch enqueue (lists), then a QueueManager with a no-op entrypoint drains them."""
    from pgqueuer import QueueManager
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries

    conn, queries = await _pgq_queries(db)
    try:
        t0 = time.perf_counter()
        for i in range(0, len(bodies), BATCH):
            chunk = bodies[i : i + BATCH]
            await queries.enqueue(["noop"] * len(chunk), list(chunk), [0] * len(chunk))
        send = time.perf_counter() - t0
        # as PGQueuer's own benchmark runs it: several QueueManagers (a connection each)
        conns = [
            await psycopg.AsyncConnection.connect(db, autocommit=True) for _ in range(PGQ_WORKERS)
        ]
        managers = [QueueManager(Queries.from_psycopg_connection(c)) for c in conns]
        count = 0

        def register(qm: Any) -> None:
            @qm.entrypoint("noop")
            async def noop(job: Job) -> None:
                nonlocal count
                count += 1
                if count >= len(bodies):
                    for m in managers:
                        m.shutdown.set()

        for qm in managers:
            register(qm)
        t0 = time.perf_counter()
        await asyncio.gather(
            *(qm.run(batch_size=PGQ_BATCH, dequeue_timeout=timedelta(seconds=1)) for qm in managers)
        )
        recv = time.perf_counter() - t0
        for c in conns:
            await c.close()
        assert count >= len(bodies), count
        await queries.uninstall()
    finally:
        await conn.close()
    return (
        Measured(len(bodies), send, note="enqueue(lists of 100)"),
        Measured(
            len(bodies),
            recv,
            note=f"{PGQ_WORKERS} QueueManagers, run(batch_size={PGQ_BATCH}), no-op entrypoint",
        ),
    )


async def pgq_latency(db: str, rate: float, seconds: float) -> Measured:
    """As :func:`fairq_latency`: a producer process enqueues batches on schedule, a
    QueueManager here runs a no-op entrypoint."""
    from pgqueuer import QueueManager
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries

    conn, queries = await _pgq_queries(db)
    lat = _Latencies()
    wconn = await psycopg.AsyncConnection.connect(db, autocommit=True)
    qm = QueueManager(Queries.from_psycopg_connection(wconn))

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        assert job.payload is not None
        lat.add([time.time() - float(json.loads(job.payload)["t"])])

    task = asyncio.create_task(qm.run(batch_size=10))
    await asyncio.sleep(1.0)
    sent = await _producer_process("pgqueuer", db, rate, seconds)
    await lat.wait_for(sent)
    qm.shutdown.set()
    await task
    await wconn.close()
    await queries.uninstall()
    await conn.close()
    return Measured(
        sent,
        seconds,
        latencies=lat.values,
        note="producer process, QueueManager.run(batch_size=10)",
    )


# -- procrastinate -------------------------------------------------------------------------
async def proc_phases(db: str, bodies: list[bytes]) -> tuple[Measured, Measured]:
    """batch_defer_async of 100 jobs at a time, then its worker (concurrency 16) drains."""
    import procrastinate

    n = len(bodies)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=db))
    count = 0
    done = asyncio.Event()

    @app.task(name="noop", queue="bench")
    async def noop(body: str) -> None:
        nonlocal count
        count += 1
        if count >= n:
            done.set()

    async with app.open_async():
        async with await psycopg.AsyncConnection.connect(db, autocommit=True) as c:
            await c.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
        await app.schema_manager.apply_schema_async()
        texts = [b.decode() for b in bodies]
        t0 = time.perf_counter()
        for i in range(0, n, BATCH):
            await noop.batch_defer_async(*({"body": t} for t in texts[i : i + BATCH]))
        send = time.perf_counter() - t0
        t0 = time.perf_counter()
        worker = asyncio.create_task(
            app.run_worker_async(queues=["bench"], concurrency=16, wait=True, delete_jobs="always")
        )
        await done.wait()
        recv = time.perf_counter() - t0
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await worker
    return (
        Measured(n, send, note="batch_defer_async of 100"),
        Measured(n, recv, note="run_worker_async(concurrency=16, delete_jobs=always)"),
    )


# -- the run -------------------------------------------------------------------------------
def _median(ms: list[Measured]) -> float:
    return statistics.median(m.rate for m in ms)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    logging.getLogger("pgqueuer").setLevel(logging.ERROR)
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    server = args.pg_url
    admin = _db_url(server, "postgres")
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as c:
        await c.execute("DROP DATABASE IF EXISTS fairq_bench WITH (FORCE)")
        await c.execute("CREATE DATABASE fairq_bench")
    db = _db_url(server, "fairq_bench")
    url = f"{db}?schema=fairq_bench&pool_max=4"
    lat_url = f"{db}?schema=fairq_bench&pool_max=8"  # batches on schedule may overlap
    n = args.n or (2_000 if args.quick else 20_000)
    runs = args.runs or (1 if args.quick else 3)
    bodies = make_bodies(n)
    results: dict[tuple[str, str], list[Measured]] = {}
    systems = [s.strip() for s in args.systems.split(",")]

    def add(system: str, phase: str, m: Measured) -> None:
        results.setdefault((system, phase), []).append(m)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        for r in range(runs):
            # every other run in reverse order: a machine whose load drifts during the
            # bench (other processes) favours no system
            for system in systems if r % 2 == 0 else systems[::-1]:
                say(f"run {r + 1}/{runs}: {system}")
                if system == RAW:
                    s, rv = await raw_phases(db, bodies)
                elif system == FAIRQ:
                    s, rv = await fairq_phases(url, bodies)
                elif system == FAIRQ_WORKER:
                    add(system, WORKER, await fairq_worker(url, bodies))
                    continue
                elif system == PGQ:
                    s, rv = await pgq_phases(db, bodies)
                    add(system, WORKER, rv)
                elif system == PROC:
                    pn = max(200, n // 10)  # procrastinate is slow: a tenth of N
                    s, rv = await proc_phases(db, bodies[:pn])
                    add(system, WORKER, rv)
                else:
                    raise SystemExit(f"unknown system {system!r}")
                add(system, SEND, s)
                add(system, RECV, rv)
                add(system, E2E, Measured(s.n, s.seconds + rv.seconds, note="send + drain"))
        if args.latency_seconds > 0:
            for r in range(runs):
                say(f"latency run {r + 1}/{runs} at {args.rate:g} msgs/s")
                if FAIRQ in systems:
                    add(
                        FAIRQ,
                        LAT,
                        await fairq_latency(lat_url, args.rate, args.latency_seconds, False),
                    )
                if FAIRQ_WORKER in systems:
                    add(
                        FAIRQ_WORKER,
                        LAT,
                        await fairq_latency(lat_url, args.rate, args.latency_seconds, True),
                    )
                if PGQ in systems:
                    add(PGQ, LAT, await pgq_latency(db, args.rate, args.latency_seconds))
    finally:
        async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as c:
            await c.execute("DROP DATABASE IF EXISTS fairq_bench WITH (FORCE)")
    rows = []
    for (system, phase), ms in results.items():
        rate = _median(ms)
        row: dict[str, Any] = {
            "system": system,
            "phase": phase,
            "n": max(m.n for m in ms),
            "msgs_per_s": rate,
            "runs": [round(m.rate, 1) for m in ms],
            "note": "; ".join(sorted({m.note for m in ms if m.note})),
            "p50_ms": None,
            "p99_ms": None,
        }
        if all(m.latencies for m in ms):
            row["p50_ms"] = statistics.median(percentile(m.latencies, 0.5) for m in ms) * 1e3
            row["p99_ms"] = statistics.median(percentile(m.latencies, 0.99) for m in ms) * 1e3
            row["received"] = [len(m.latencies) for m in ms]
        raw = results.get((RAW, phase))
        if raw and system != RAW:
            row["vs_raw"] = rate / _median(raw)
        peers = [(_median(results[(p, phase)]), p) for p in PEERS if (p, phase) in results]
        best = max(peers, default=None)
        if best and system not in PEERS:
            row["vs_best_peer"], row["best_peer"] = rate / best[0], best[1]
        if (PROC, phase) in results and system == FAIRQ:
            row["vs_procrastinate"] = rate / _median(results[(PROC, phase)])
        rows.append(row)
    order = {p: i for i, p in enumerate((SEND, RECV, E2E, WORKER, LAT))}
    rows.sort(key=lambda r: (order[r["phase"]], systems.index(r["system"])))
    versions = {}
    for pkg in ("psycopg", "psycopg-pool", "pgqueuer", "procrastinate"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[pkg] = metadata.version(pkg)
    async with await psycopg.AsyncConnection.connect(admin) as c:
        cur = await c.execute(
            "SELECT version(), current_setting('fsync'), current_setting('synchronous_commit')"
        )
        pg = await cur.fetchone()
    return {
        "benchmark": "queues-postgres",
        "n": n,
        "runs": runs,
        "batch": BATCH,
        "rate": args.rate,
        "latency_seconds": args.latency_seconds,
        "machine": machine(),
        "source": source(),
        "postgres": {
            "version": pg[0] if pg else "",
            "fsync": pg[1] if pg else "",
            "synchronous_commit": pg[2] if pg else "",
        },
        "versions": versions,
        "results": rows,
    }


def report(doc: dict[str, Any]) -> str:
    lines = [
        f"PostgreSQL queue benchmark, N={doc['n']}, batches of {doc['batch']}, "
        f"median of {doc['runs']}",
        f"{'system':<15} {'phase':<12} {'msgs/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'vs raw':>7} {'vs best peer':>13}  note",
    ]
    for r in doc["results"]:
        vs_raw = f"{r['vs_raw']:.2f}" if r.get("vs_raw") else "-"
        vs_peer = f"{r['vs_best_peer']:.2f} ({r['best_peer']})" if r.get("vs_best_peer") else "-"
        p50 = f"{r['p50_ms']:.1f}" if r.get("p50_ms") is not None else "-"
        p99 = f"{r['p99_ms']:.1f}" if r.get("p99_ms") is not None else "-"
        lines.append(
            f"{r['system']:<15} {r['phase']:<12} {r['msgs_per_s']:>10,.0f} {p50:>8} {p99:>8} "
            f"{vs_raw:>7} {vs_peer:>13}  {r['note']}"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.queues --backend postgres")
    p.add_argument("--backend", default="postgres")
    p.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--n", type=int)
    p.add_argument("--runs", type=int)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--latency-seconds", type=float, default=10.0)
    p.add_argument("--systems", default=",".join((RAW, FAIRQ, FAIRQ_WORKER, PGQ, PROC)))
    p.add_argument("--soak", action="store_true", help="run the soak instead (bench.soak)")
    p.add_argument("--soak-minutes", type=float, default=20.0)
    p.add_argument("--hold-minutes", type=float, default=2.0)
    p.add_argument(
        "--own-cluster", action="store_true", help="run on a throw-away cluster of its own"
    )
    p.add_argument(
        "--cluster-ports",
        type=_ports,
        default=range(15460, 15470),
        help="ports the own cluster may take (default 15460-15469)",
    )
    p.add_argument("--json", type=Path)
    p.add_argument("--produce", help=argparse.SUPPRESS)  # the latency runs' producer process
    p.add_argument("--produce-url", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _ports(text: str) -> range:
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.produce:
        n = asyncio.run(_produce(args.produce, args.produce_url, args.rate, args.latency_seconds))
        print(n)
        return 0
    if args.soak:
        from .soak_postgres import soak

        return soak(args)
    if args.quick and args.latency_seconds == 10.0:
        args.latency_seconds = 3.0
    cluster = None
    if args.own_cluster:
        from .soak_postgres import OwnCluster

        cluster = OwnCluster(args.cluster_ports)
        args.pg_url = cluster.url
    try:
        doc = asyncio.run(run(args))
    finally:
        if cluster is not None:
            cluster.remove()
    doc["server"] = "own cluster (stock settings)" if cluster else args.pg_url
    path = args.json or RESULTS / (
        "queues-postgres-quick.json" if args.quick else "queues-postgres.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(report(doc))
    print(f"results written to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
