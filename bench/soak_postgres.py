"""The PostgreSQL soak: fairq at a steady rate for ``--soak-minutes`` (20), while another
session holds a REPEATABLE READ transaction open for ``--hold-minutes`` (2) — the xmin
horizon held back, so no dead row can be vacuumed meanwhile — and after it ends. Every 10 s
it records throughput, the size of fairq's tables and indexes and their dead rows; the
figures go to ``bench/results/queues-postgres-soak.json`` and a plot to
``docs/bench-postgres-soak.png``. Not part of CI.

    python -m bench.queues --backend postgres --soak [--soak-minutes 20 --hold-minutes 2]

``--own-cluster`` runs it on a cluster of its own with the stock settings (autovacuum on);
without it, on ``--pg-url``, whose autovacuum settings then decide what the soak shows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

import fairq

from .queues import machine, make_bodies, source

RESULTS = Path(__file__).resolve().parent / "results"
DOCS = Path(__file__).resolve().parents[1] / "docs"
SCHEMA = "fairq_soak"
RATE = 1000.0  # messages per second, sent in batches of BATCH
BATCH = 10
SAMPLE = 10.0


async def _sizes(conn: psycopg.AsyncConnection[Any]) -> dict[str, float]:
    cur = await conn.execute(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0), "
        "coalesce(sum(pg_total_relation_size(c.oid)) FILTER (WHERE c.relname = 'messages'), 0), "
        "coalesce(sum(s.n_dead_tup), 0), coalesce(sum(s.n_live_tup), 0), "
        "coalesce(sum(s.autovacuum_count), 0) "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid "
        "WHERE n.nspname = %s AND c.relkind = 'r'",
        (SCHEMA,),
    )
    row = await cur.fetchone()
    assert row is not None
    return {
        "total_mb": float(row[0]) / 2**20,
        "messages_mb": float(row[1]) / 2**20,
        "dead_rows": float(row[2]),
        "live_rows": float(row[3]),
        "autovacuums": float(row[4]),
    }


class OwnCluster:
    """A PostgreSQL cluster of the bench's own (initdb as the postgres user, a port in
    ``ports`` — 15460-15469 unless told, the packaged defaults: autovacuum on, fsync and
    synchronous_commit on), so the bench measures what a stock server does whatever the
    shared server is configured to do (and leaves the shared one alone)."""

    BIN = Path("/usr/lib/postgresql/15/bin")

    def __init__(self, ports: range = range(15460, 15470)) -> None:
        import shutil
        import socket
        import subprocess
        import tempfile

        for port in ports:  # this project's spare ports
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
                break
        else:
            raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1}")

        self.dir = Path(tempfile.mkdtemp(prefix="fairq-soak-"))
        shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        self.port = port
        self._run = lambda *a: subprocess.run(
            ["su", "postgres", "-c", " ".join(f"'{x}'" for x in a)],
            capture_output=True,
            text=True,
            check=True,
        )
        self._run(str(self.BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")
        with (self.data / "postgresql.conf").open("a") as f:
            f.write(
                f"\nport = {port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.dir}'\n"
            )
        self._run(
            str(self.BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "log"),
            "-w",
            "start",
        )
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def remove(self) -> None:
        import shutil

        try:
            self._run(str(self.BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    server = args.pg_url
    url = f"{server}?schema={SCHEMA}&pool_max=8"
    async with await psycopg.AsyncConnection.connect(server, autocommit=True) as c:
        await c.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    seconds = args.soak_minutes * 60
    hold_at = seconds / 3
    hold_for = args.hold_minutes * 60
    bodies = make_bodies(BATCH)
    samples: list[dict[str, Any]] = []
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("soak", dedup_window=0)
        stop = asyncio.Event()
        counts = {"sent": 0, "acked": 0}

        async def produce() -> None:
            interval = BATCH / RATE
            start = time.perf_counter()
            i = 0
            while not stop.is_set():
                due = start + i * interval
                now = time.perf_counter()
                if due > now:
                    await asyncio.sleep(due - now)
                await q.send_batch([fairq.Outgoing(b) for b in bodies])
                counts["sent"] += BATCH
                i += 1

        async def consume() -> None:
            while not stop.is_set():
                msgs = await q.receive(max_messages=100, wait=0.5)
                if msgs:
                    await q.ack_batch([m.receipt for m in msgs])
                    counts["acked"] += len(msgs)

        async def hold() -> None:
            await asyncio.sleep(hold_at)
            async with await psycopg.AsyncConnection.connect(server) as h:
                await h.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                await h.execute(f"SELECT count(*) FROM {SCHEMA}.queues")  # the snapshot
                print(f"holding a REPEATABLE READ snapshot for {hold_for:g} s", file=sys.stderr)
                await asyncio.sleep(hold_for)
                await h.execute("COMMIT")
            print("snapshot released", file=sys.stderr)

        tasks = [asyncio.create_task(x()) for x in (produce, consume, consume, hold)]
        async with await psycopg.AsyncConnection.connect(server, autocommit=True) as mon:
            start = time.perf_counter()
            last = dict(counts)
            while (elapsed := time.perf_counter() - start) < seconds:
                await asyncio.sleep(SAMPLE)
                now = dict(counts)
                sizes = await _sizes(mon)
                t = time.perf_counter() - start
                phase = "before"
                if hold_at <= t < hold_at + hold_for:
                    phase = "held"
                elif t >= hold_at + hold_for:
                    phase = "after"
                sample = {
                    "t": round(t, 1),
                    "phase": phase,
                    "acked_per_s": (now["acked"] - last["acked"]) / SAMPLE,
                    "sent_per_s": (now["sent"] - last["sent"]) / SAMPLE,
                    "backlog": now["sent"] - now["acked"],
                    **sizes,
                }
                samples.append(sample)
                last = now
                print(json.dumps(sample), file=sys.stderr)
                del elapsed
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    async with await psycopg.AsyncConnection.connect(server, autocommit=True) as c:
        await c.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")

    def summary(phase: str) -> dict[str, float]:
        xs = [s for s in samples if s["phase"] == phase]
        if not xs:
            return {}
        return {
            "acked_per_s_median": sorted(s["acked_per_s"] for s in xs)[len(xs) // 2],
            "total_mb_max": max(s["total_mb"] for s in xs),
            "total_mb_last": xs[-1]["total_mb"],
            "dead_rows_max": max(s["dead_rows"] for s in xs),
        }

    return {
        "benchmark": "queues-postgres-soak",
        "rate": RATE,
        "minutes": args.soak_minutes,
        "hold_minutes": args.hold_minutes,
        "hold_at_s": hold_at,
        "machine": machine(),
        "source": source(),
        "summary": {p: summary(p) for p in ("before", "held", "after")},
        "samples": samples,
    }


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [s["t"] / 60 for s in doc["samples"]]
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    a.plot(xs, [s["acked_per_s"] for s in doc["samples"]], label="acked / s")
    a.plot(xs, [s["sent_per_s"] for s in doc["samples"]], label="sent / s", alpha=0.6)
    a.set_ylabel("messages / s")
    a.legend(loc="lower right")
    b.plot(xs, [s["total_mb"] for s in doc["samples"]], label="fairq tables + indexes (MB)")
    b.plot(xs, [s["messages_mb"] for s in doc["samples"]], label="messages (MB)")
    b.set_ylabel("MB")
    b.set_xlabel("minutes")
    b.legend(loc="upper left")
    for ax in (a, b):
        start = doc["hold_at_s"] / 60
        ax.axvspan(start, start + doc["hold_minutes"], color="orange", alpha=0.2)
    a.set_title(
        f"fairq on PostgreSQL, {doc['rate']:g} msgs/s; shaded: a REPEATABLE READ "
        "transaction held open"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def soak(args: argparse.Namespace) -> int:
    cluster = None
    if args.own_cluster:
        cluster = OwnCluster(args.cluster_ports)
        args.pg_url = cluster.url
    try:
        doc = asyncio.run(_run(args))
    finally:
        if cluster is not None:
            cluster.remove()
    doc["server"] = "own cluster (stock settings)" if cluster else args.pg_url
    out = args.json or RESULTS / "queues-postgres-soak.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, DOCS / "bench-postgres-soak.png")
    print(json.dumps(doc["summary"], indent=2))
    return 0
