"""How many slices a second ONE attention domain serves on PostgreSQL, and what its takes and
ends cost per call: ``python -m bench.attention_slices_postgres``.

One domain, ``--keys`` keys (default 3,000) of one message each, published first; then one
Worker with ``--workers`` slots (default 8) drains them, each message a 1 ms handler (an
awaited sleep). Every slice is a take, a receive, an ack and an end, so the drain rate is
the domain's slice rate; with one message per key, the take and the end — the two steps
that lock the domain's row — are most of the work. Reported per run: slices/s over the
drain, and the median and p90 of the backend's ``attention_take`` and ``attention_end``
calls (timed in the worker's process, round trips included). ``--runs`` runs (default 3),
medians across runs. Each run uses a schema of its own on ``--url`` (default the local
server), dropped afterwards. ``--label`` names the run in
``bench/results/attention-slices-postgres.json`` (kept per label, so a run of another
tree — ``PYTHONPATH=/tmp/before/src python -m bench.attention_slices_postgres --label
before`` — sits beside this one's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg

import fairq

PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
RESULTS = Path(__file__).parent / "results" / "attention-slices-postgres.json"


class Timed:
    """Wraps some of a backend's methods in place and records each call's seconds."""

    def __init__(self, backend: Any, names: list[str]) -> None:
        self.seconds: dict[str, list[float]] = {n: [] for n in names}
        for name in names:
            setattr(backend, name, self._wrap(name, getattr(backend, name)))

    def _wrap(self, name: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                self.seconds[name].append(time.perf_counter() - t0)

        return timed


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def one_run(url: str, keys: int, workers: int, limit: float) -> dict[str, Any]:
    schema = f"bench_slices_{os.getpid()}_{int(time.time() * 1000) % 10**9}"
    full = f"{url}{'&' if '?' in url else '?'}schema={schema}"
    try:
        broker = await fairq.connect(full)
        a = await broker.declare_attention("one", plans={"basic": fairq.Plan(1, 10, 20.0)})
        sem = asyncio.Semaphore(16)

        async def put(i: int) -> None:
            async with sem:
                await a.publish(f"k{i}", b"x")

        await asyncio.gather(*(put(i) for i in range(keys)))
        done = 0
        finished = asyncio.Event()
        worker = fairq.Worker(broker, concurrency=workers, handle_signals=False, poll_wait=0.5)

        @worker.attention("one")
        async def handle(msg: fairq.Received) -> None:
            nonlocal done
            await asyncio.sleep(0.001)
            done += 1
            if done >= keys:
                finished.set()

        timed = Timed(broker.backend, ["attention_take", "attention_end"])
        t0 = time.perf_counter()
        task = asyncio.create_task(worker.run())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(finished.wait(), limit)
        wall = time.perf_counter() - t0
        worker.stop()
        await task
        await broker.close()
    finally:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
            await c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    take, end = timed.seconds["attention_take"], timed.seconds["attention_end"]
    return {
        "handled": done,
        "wall": wall,
        "slices_per_s": done / wall,
        "takes": len(take),
        "take_p50_ms": 1000 * _pct(take, 0.5),
        "take_p90_ms": 1000 * _pct(take, 0.9),
        "end_p50_ms": 1000 * _pct(end, 0.5),
        "end_p90_ms": 1000 * _pct(end, 0.9),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=PG_URL)
    p.add_argument("--keys", type=int, default=3000)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--limit", type=float, default=120.0, help="seconds allowed per drain")
    p.add_argument("--label", default="this tree")
    args = p.parse_args()
    runs = []
    for i in range(args.runs):
        r = asyncio.run(one_run(args.url, args.keys, args.workers, args.limit))
        print(f"run {i + 1}: " + ", ".join(f"{k} {v:.4g}" for k, v in r.items()), flush=True)
        runs.append(r)
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    load = os.getloadavg()
    print(
        f"{args.label}: {med['slices_per_s']:.1f} slices/s (median of {args.runs}); take "
        f"p50 {med['take_p50_ms']:.1f} ms p90 {med['take_p90_ms']:.1f} ms; end p50 "
        f"{med['end_p50_ms']:.1f} ms p90 {med['end_p90_ms']:.1f} ms; load {load[0]:.2f}"
    )
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data[args.label] = {
        "keys": args.keys,
        "workers": args.workers,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load": load[0],
        "runs": runs,
        "median": med,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=2) + "\n")
    print(f"results: {RESULTS}")


if __name__ == "__main__":
    main()
