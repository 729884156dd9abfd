"""Publish/subscribe benchmarks on the SQLite backend, in one run:

1. publish throughput (batches of 100) to a topic with 1, 4 and 16 fanout subscriptions,
   beside the plain queue send rate measured in the same run (publishing to 4
   subscriptions writes 4 copies; the target is at least 25% of the plain send rate);
2. matching cost: publishing to a topic with 10 vs 10,000 subscriptions of distinct
   exact routing keys, and of simple patterns (``shop<i>.*.paid``), each message matching
   one subscription (the target: within 3x).

    python -m bench.pubsub            # 3 runs, medians
    python -m bench.pubsub --quick    # 1 run, fewer messages

Results go to a rich table and ``bench/results/pubsub.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import fairq

RESULTS = Path(__file__).resolve().parent / "results"
BODY = (
    b'{"type":"OrderConfirmed","order":"o-7731","seats":["B-12","B-13"],"pad":"'
    + b"x" * 130
    + b'"}'
)
BATCH = 100


async def _broker(tmp: Path) -> fairq.Broker:
    return await fairq.connect(f"sqlite:///{tmp / 'bench.db'}")


async def plain_send(n: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        broker = await _broker(Path(d))
        q = await broker.declare_queue("plain")
        started = time.perf_counter()
        for _ in range(n // BATCH):
            await q.send_batch([fairq.Outgoing(BODY) for _ in range(BATCH)])
        rate = n / (time.perf_counter() - started)
        await broker.close()
        return rate


async def fanout_publish(subscriptions: int, n: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        broker = await _broker(Path(d))
        t = await broker.declare_topic("order-events")
        for i in range(subscriptions):
            await t.subscribe(f"s{i}")
        started = time.perf_counter()
        for _ in range(n // BATCH):
            await t.publish_batch(
                [fairq.Outgoing(BODY, routing_key="order.confirmed.br") for _ in range(BATCH)]
            )
        rate = n / (time.perf_counter() - started)
        await broker.close()
        return rate


async def matching_publish(subscriptions: int, kind: str, n: int) -> float:
    """Publish rate when each message matches exactly one of ``subscriptions``."""
    with tempfile.TemporaryDirectory() as d:
        broker = await _broker(Path(d))
        t = await broker.declare_topic("shops")
        patterns = [
            f"shop{i}.order.paid" if kind == "exact" else f"shop{i}.*.paid"
            for i in range(subscriptions)
        ]
        for start in range(0, subscriptions, 500):  # concurrent calls share transactions
            await asyncio.gather(
                *[
                    t.subscribe(f"s{i}", routing=patterns[i], dead_letter=None)
                    for i in range(start, min(start + 500, subscriptions))
                ]
            )
        rng = random.Random(7)
        keys = [f"shop{rng.randrange(subscriptions)}.order.paid" for _ in range(n)]
        await t.publish(b"warm-up", routing_key=keys[0])  # builds the cached index
        started = time.perf_counter()
        for i in range(0, n, BATCH):
            results = await t.publish_batch(
                [fairq.Outgoing(BODY, routing_key=k) for k in keys[i : i + BATCH]]
            )
            assert all(len(r.subscriptions) == 1 for r in results)
        rate = n / (time.perf_counter() - started)
        await broker.close()
        return rate


async def run(runs: int, n: int, match_n: int, big: int) -> dict[str, Any]:
    samples: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        samples.setdefault(name, []).append(value)

    for r in range(runs):
        print(f"run {r + 1}/{runs}", flush=True)
        add("queue send", await plain_send(n))
        for subs in (1, 4, 16):
            add(f"publish, {subs} subscription(s)", await fanout_publish(subs, n))
        for kind in ("exact", "pattern"):
            for subs in (10, big):
                add(f"publish, {subs} {kind} routes", await matching_publish(subs, kind, match_n))
    medians = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "runs": runs,
        "n": n,
        "match_n": match_n,
        "big": big,
        "samples": samples,
        "medians": medians,
    }


def report(result: dict[str, Any], console: Console) -> list[tuple[str, bool]]:
    m = result["medians"]
    plain = m["queue send"]
    table = Table(
        title=f"fairq pub/sub on SQLite — medians of {result['runs']} run(s), batches of {BATCH}"
    )
    for col in ("what", "messages/s", "copies/s", "vs plain send"):
        table.add_column(col, justify="left" if col == "what" else "right")
    table.add_row("queue send (plain)", f"{plain:,.0f}", f"{plain:,.0f}", "1.00")
    for subs in (1, 4, 16):
        rate = m[f"publish, {subs} subscription(s)"]
        table.add_row(
            f"publish to {subs} subscription(s)",
            f"{rate:,.0f}",
            f"{rate * subs:,.0f}",
            f"{rate / plain:.2f}",
        )
    big = result["big"]
    for kind in ("exact", "pattern"):
        small, large = m[f"publish, 10 {kind} routes"], m[f"publish, {big} {kind} routes"]
        table.add_row(
            f"publish, 10 {kind} routes", f"{small:,.0f}", f"{small:,.0f}", f"{small / plain:.2f}"
        )
        table.add_row(
            f"publish, {big:,} {kind} routes",
            f"{large:,.0f}",
            f"{large:,.0f}",
            f"{large / plain:.2f}  (cost x{small / large:.2f} of 10)",
        )
    console.print(table)
    four = m["publish, 4 subscription(s)"] / plain
    checks = [
        (
            f"4 subscriptions publish at {four:.0%} of the plain send rate (target >= 25%)",
            four >= 0.25,
        )
    ]
    for kind in ("exact", "pattern"):
        ratio = m[f"publish, 10 {kind} routes"] / m[f"publish, {big} {kind} routes"]
        checks.append((f"{big:,} {kind} routes cost x{ratio:.2f} of 10 (target <= 3)", ratio <= 3))
    for text, ok in checks:
        console.print(("[green]holds[/green] " if ok else "[red]fails[/red] ") + text)
    return checks


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pubsub", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--n", type=int, default=20_000, help="messages per fanout measurement")
    parser.add_argument("--quick", action="store_true", help="1 run, small N, 1,000 routes")
    args = parser.parse_args(argv)
    runs, n, match_n, big = args.runs, args.n, 10_000, 10_000
    if args.quick:
        runs, n, match_n, big = 1, 2_000, 2_000, 1_000
    result = asyncio.run(run(runs, n, match_n, big))
    console = Console()
    checks = report(result, console)
    result["checks"] = [{"text": t, "holds": ok} for t, ok in checks]
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("pubsub-quick.json" if args.quick else "pubsub.json")
    out.write_text(json.dumps(result, indent=2))
    console.print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
