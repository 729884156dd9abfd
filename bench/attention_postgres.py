"""Issue 16's share scenario on PostgreSQL: ``python -m bench.attention_postgres``.

Tenant A: one deep key; tenant B: 2,000 keys of 10 messages; one plan that lets A fan out
(4 slices of 50 messages, 20 s); 4 worker slots in a process of their own, 1 ms handlers.
The backlogs are published first (by this process), then the worker runs; after 2 s of
warm-up a window (``--window``, 10 s; ``--quick``: 5 s) measures, for each tenant:

* worker time — the seconds its slices held a worker, as the backend charges them
  (``Attention.tenant_stats()`` sampled each second by the worker process: what its
  ``busy`` gained over the window), the acceptance figure: **B/A within 0.8-1.25**;
* handler time — the seconds its handlers ran (the worker's own clock), and messages.

``--capped`` runs it again with A's key on a plan of one slice: B gets the other workers
and the tenant stats say A is at its cap. ``--charge messages`` charges slices by the
messages they handle. Each variant runs ``--runs`` times (default 3); the table gives the
medians. Every run uses a schema of its own on ``--pg-url`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``), dropped afterwards. Results:
``bench/results/attention-postgres.json``.

Uses :func:`bench.attention._started` (a worker run as a task, stopped by the coroutine
it returns).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

import fairq

from .attention import _started

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
HANDLER = 0.001  # seconds every handler takes (an awaited sleep, like an API call)
WORKERS = 4
WARMUP = 2.0


def _url(pg_url: str, schema: str) -> str:
    sep = "&" if "?" in pg_url else "?"
    return f"{pg_url}{sep}schema={schema}"


async def _publish(url: str, deep: int, keys: int, capped: bool, charge: str) -> None:
    """The domain and both tenants' backlogs (16 publishes at a time)."""
    plans = {"basic": fairq.Plan(WORKERS, 50, 20.0), "one": fairq.Plan(1, 50, 20.0)}
    async with await fairq.connect(url) as broker:
        a = await broker.declare_attention("ab", plans=plans, charge=charge)  # type: ignore[arg-type]
        await a.set_resource("A-0", tenant="A", plan="one" if capped else None)
        for i in range(0, deep, 1000):
            await a.publish_batch("A-0", [fairq.Outgoing(b"A") for _ in range(min(1000, deep - i))])
        sem = asyncio.Semaphore(16)

        async def one(i: int) -> None:
            async with sem:
                await a.set_resource(f"B-{i}", tenant="B")
                await a.publish_batch(f"B-{i}", [fairq.Outgoing(b"B") for _ in range(10)])

        await asyncio.gather(*(one(i) for i in range(keys)))


async def _work(url: str, seconds: float, out: Path) -> None:
    """The worker process: 4 slots, 1 ms handlers, the tenant stats once a second."""
    broker = await fairq.connect(url)
    a = broker.attention("ab")
    seen: list[tuple[float, str, float]] = []  # (handler start, tenant, seconds it ran)
    worker = fairq.Worker(broker, concurrency=WORKERS, handle_signals=False, poll_wait=1.0)

    @worker.attention("ab")
    async def handle(msg: fairq.Received) -> None:
        started = time.time()
        await asyncio.sleep(HANDLER)
        seen.append((started, msg.text(), time.time() - started))

    samples: list[tuple[float, list[dict[str, Any]]]] = []

    async def sample() -> None:
        while True:
            await asyncio.sleep(1.0)
            rows = await a.tenant_stats(top=5)
            samples.append(
                (
                    time.time(),
                    [
                        {"tenant": t.tenant, "busy": t.busy, "at_cap": t.at_cap, "share": t.share}
                        for t in rows
                    ],
                )
            )

    sampler = asyncio.create_task(sample())
    stop = _started(worker)
    print("ready", time.time(), flush=True)
    await asyncio.sleep(seconds)
    sampler.cancel()
    await stop()
    await broker.close()
    await asyncio.to_thread(out.write_text, json.dumps({"seen": seen, "samples": samples}))


def _busy(row: list[dict[str, Any]], tenant: str) -> float:
    return next((float(x["busy"]) for x in row if x["tenant"] == tenant), 0.0)


async def one_run(
    pg_url: str, quick: bool, capped: bool, charge: str, n: int, window: float
) -> dict[str, Any]:
    schema = f"bench_att_{int(time.time())}_{n}"
    url = _url(pg_url, schema)
    deep, keys = (30_000, 1_000) if quick else (60_000, 2_000)
    out = RESULTS / f".attention-postgres-{schema}.json"
    try:
        await _publish(url, deep, keys, capped, charge)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.attention_postgres",
            "--role",
            "work",
            url,
            str(WARMUP + window + 0.5),
            str(out),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None
        line = (await proc.stdout.readline()).decode().split()
        assert line and line[0] == "ready", f"the worker did not start: {line}"
        t0 = float(line[1]) + WARMUP
        await asyncio.wait_for(proc.wait(), WARMUP + window + 120)
        got = json.loads(await asyncio.to_thread(out.read_text))
    finally:
        out.unlink(missing_ok=True)
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as c:
            await c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    inside = [(tag, took) for t, tag, took in got["seen"] if t0 <= t < t0 + window]
    messages = Counter(tag for tag, _ in inside)
    handler: Counter[str] = Counter()
    for tag, took in inside:
        handler[tag] += took
    rows = got["samples"]
    first = min(rows, key=lambda r: abs(r[0] - t0))
    last = min(rows, key=lambda r: abs(r[0] - (t0 + window)))
    worker_s = {t: _busy(last[1], t) - _busy(first[1], t) for t in ("A", "B")}
    in_window = [r for r in rows if t0 <= r[0] <= t0 + window]
    capped_flags = [any(x["tenant"] == "A" and x["at_cap"] for x in r[1]) for r in in_window]
    return {
        "worker_s": worker_s,
        "worker_B_per_A": worker_s["B"] / max(1e-9, worker_s["A"]),
        "worker_share_A": worker_s["A"] / max(1e-9, sum(worker_s.values())),
        "handler_B_per_A": handler["B"] / max(1e-9, handler["A"]),
        "messages": dict(messages),
        "messages_B_per_A": messages["B"] / max(1, messages["A"]),
        "A_at_cap_fraction": sum(capped_flags) / len(capped_flags) if capped_flags else None,
        "msgs_per_s": sum(messages.values()) / window,
    }


def _median(runs: list[dict[str, Any]], name: str) -> float | None:
    values = [r[name] for r in runs if r.get(name) is not None]
    return statistics.median(values) if values else None


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    variants = [("shares", False, a.charge)]
    if a.capped:
        variants.append(("capped", True, a.charge))
    doc: dict[str, Any] = {
        "handler_s": HANDLER,
        "workers": WORKERS,
        "quick": a.quick,
        "window_s": a.window,
    }
    n = 0
    for name, capped, charge in variants:
        runs = []
        for _ in range(a.runs):
            n += 1
            runs.append(await one_run(a.pg_url, a.quick, capped, charge, n, a.window))
            r = runs[-1]
            print(
                f"{name} run {len(runs)}: worker B/A {r['worker_B_per_A']:.2f}, handler B/A "
                f"{r['handler_B_per_A']:.2f}, messages B/A {r['messages_B_per_A']:.2f}, "
                f"{r['msgs_per_s']:.0f} msgs/s, A at cap {r['A_at_cap_fraction']}",
                flush=True,
            )
        doc[name] = {
            "charge": charge,
            "runs": runs,
            "median": {
                k: _median(runs, k)
                for k in (
                    "worker_B_per_A",
                    "worker_share_A",
                    "handler_B_per_A",
                    "messages_B_per_A",
                    "A_at_cap_fraction",
                    "msgs_per_s",
                )
            },
        }
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--quick", action="store_true", help="1,000 B keys, 5 s windows")
    parser.add_argument("--capped", action="store_true", help="also with A at one slice")
    parser.add_argument("--charge", default="time", choices=("time", "messages"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--window", type=float, help="seconds measured (default 10, quick 5)")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    a, rest = parser.parse_known_args(argv)
    a.window = a.window or (5.0 if a.quick else 10.0)
    if a.role == "work":
        url, seconds, out = rest
        asyncio.run(_work(url, float(seconds), Path(out)))
        return 0
    doc = asyncio.run(main_async(a))
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / ("attention-postgres-quick.json" if a.quick else "attention-postgres.json")
    path.write_text(json.dumps(doc, indent=1))
    for name in ("shares", "capped"):
        if name in doc:
            m = doc[name]["median"]
            print(
                f"{name} (charge={doc[name]['charge']}, medians of {a.runs}): worker-time "
                f"B/A {m['worker_B_per_A']:.2f} (share of A {m['worker_share_A']:.2f}), "
                f"handler time B/A {m['handler_B_per_A']:.2f}, messages B/A "
                f"{m['messages_B_per_A']:.2f}, A at cap {m['A_at_cap_fraction']}, "
                f"{m['msgs_per_s']:.0f} msgs/s"
            )
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
