"""Queue benchmarks on PostgreSQL: fairq beside a raw psycopg ``FOR UPDATE SKIP LOCKED``
loop, PGQueuer (its QueueManager, no-op entrypoint, batch enqueue) and procrastinate (its
worker), on the same server and database, with the same ~200-byte bodies.

    python -m bench.queues --backend postgres              # N=20,000, 3 runs, latency
    python -m bench.queues --backend postgres --quick      # N=2,000, 1 run
    python -m bench.queues --backend postgres --soak       # the 20-minute soak (not in CI)

Options: ``--pg-url`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``; a
database ``fairq_bench`` is made beside it and dropped at the end), ``--n``, ``--runs``,
``--rate`` and ``--latency-seconds`` (steady-rate latency), ``--soak-minutes``,
``--hold-minutes``. Phases:

* **send** — N messages in batches of 100 (one batch per call/statement);
* **receive+ack** — drain them in batches of 100 (fairq: receive 100 then ack_batch);
* **end to end** — N / (send time + receive+ack time): the acceptance figure;
* **worker** — N sent in batches, then the system's own worker runs no-op handlers until
  all are done (fairq's ``Worker``, PGQueuer's ``QueueManager``, procrastinate's worker);
* **latency** — one message every 1/rate s for ``--latency-seconds``, a waiting consumer;
  p50/p99 from send to handler.

Each figure is the median of ``--runs`` runs, systems interleaved per run; ratios are to
the raw loop and to the best peer of the same run. Results: ``bench/results/
queues-postgres.json`` (``-quick``), the soak in ``queues-postgres-soak.json``;
``python -m bench.plot_postgres`` draws them.
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

from .queues import Measured, machine, make_bodies, percentile, source, stamped_body

RESULTS = Path(__file__).resolve().parent / "results"
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


async def fairq_latency(url: str, rate: float, seconds: float, worker: bool) -> Measured:
    async with await fairq.connect(url) as producer, await fairq.connect(url) as consumer:
        name = "bench-lat-w" if worker else "bench-lat"
        await producer.delete_queue(name)
        q = await producer.declare_queue(name, dead_letter=None, dedup_window=0)
        lat: list[float] = []
        stop = asyncio.Event()
        if worker:
            w = fairq.Worker(consumer, concurrency=32, handle_signals=False, poll_wait=1.0)

            @w.queue(name, concurrency=32)
            async def handle(msg: fairq.Received) -> None:
                lat.append(time.time() - float(msg.json()["t"]))

            task = asyncio.create_task(w.run())
        else:
            cq = consumer.queue(name)

            async def consume() -> None:
                while not stop.is_set():
                    msgs = await cq.receive(max_messages=BATCH, wait=0.5)
                    now = time.time()
                    lat.extend(now - float(m.json()["t"]) for m in msgs)
                    if msgs:
                        await cq.ack_batch([m.receipt for m in msgs])

            task = asyncio.create_task(consume())
        await asyncio.sleep(0.5)
        sent = await _steady(lambda i: q.send(stamped_body(i)), rate, seconds)
        await asyncio.sleep(1.0)
        stop.set()
        if worker:
            w.stop()
        await task
        await producer.delete_queue(name)
    note = "Worker(concurrency=32)" if worker else "receive(wait=0.5, max 100) + ack_batch"
    return Measured(sent, seconds, latencies=lat, note=note)


async def _steady(send: Callable[[int], Awaitable[Any]], rate: float, seconds: float) -> int:
    """Send one message every 1/rate s (on schedule, not after the previous returned)."""
    interval = 1.0 / rate
    start = time.perf_counter()
    i = 0
    pending: set[asyncio.Task[Any]] = set()
    while (now := time.perf_counter()) - start < seconds:
        due = start + i * interval
        if due > now:
            await asyncio.sleep(due - now)
        t = asyncio.create_task(send(i))
        pending.add(t)
        t.add_done_callback(pending.discard)
        i += 1
    await asyncio.gather(*pending)
    return i


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
    from pgqueuer import QueueManager
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries

    conn, queries = await _pgq_queries(db)
    lat: list[float] = []
    wconn = await psycopg.AsyncConnection.connect(db, autocommit=True)
    qm = QueueManager(Queries.from_psycopg_connection(wconn))

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        assert job.payload is not None
        lat.append(time.time() - float(json.loads(job.payload)["t"]))

    task = asyncio.create_task(qm.run(batch_size=10))
    await asyncio.sleep(1.0)
    sent = await _steady(lambda i: queries.enqueue("noop", stamped_body(i), 0), rate, seconds)
    await asyncio.sleep(1.0)
    qm.shutdown.set()
    await task
    await wconn.close()
    await queries.uninstall()
    await conn.close()
    return Measured(sent, seconds, latencies=lat, note="QueueManager.run(batch_size=10)")


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
    lat_url = f"{db}?schema=fairq_bench&pool_max=16"  # a send per 1/rate s: commits overlap
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
            for system in systems:
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
                        FAIRQ, LAT, await fairq_latency(url, args.rate, args.latency_seconds, False)
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
    p.add_argument("--own-cluster", action="store_true", help="soak on a cluster of its own")
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.soak:
        from .soak_postgres import soak

        return soak(args)
    if args.quick and args.latency_seconds == 10.0:
        args.latency_seconds = 3.0
    doc = asyncio.run(run(args))
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
