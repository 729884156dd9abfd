"""SQLite under write contention between processes (issue 16 item 2): does a process that
needs the write lock get it while another commits in a tight loop?

* **lock wait**: a publisher process publishes to attention keys one message per
  transaction, as fast as it can; this process sends one message every 2 ms to a queue of
  its own and times each ``send`` (= the time it went without a commit while it needed
  one). Reported: p50 / p99 / max, and the publisher's rate meanwhile.
* **burst**: 4 workers (``fairq.Worker(concurrency=4)``, 1 ms handlers) consume an
  attention domain while a publisher sends a burst of ``--keys`` small keys ×
  ``--per-key`` messages (round robin, one transaction each). The publisher runs either
  in the worker's own process and event loop (**in-process**) or in a process of its own
  (**cross-process**, as in a deployment). Wait = handler start − ``time.time()`` stamped
  before the publish. The target: cross-process p99 ≤ 3× in-process p99.

Each figure is the median of ``--runs`` runs (interleaved); each run has a fresh file.

    python -m bench.sqlite_contention                 # 3 runs of each, ~1 min
    python -m bench.sqlite_contention --runs 1 --keys 100
    PYTHONPATH=<checkout of an older commit>/src python -m bench.sqlite_contention  # before
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

import fairq

ROOT = Path(__file__).resolve().parents[1]
DOMAIN = "burst"
HANDLER_S = 0.001
WORKERS = 4


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")


async def _declare(broker: fairq.Broker) -> fairq.Attention:
    return await broker.declare_attention(
        DOMAIN,
        plans={"basic": fairq.Plan(1, 50, 20.0)},
        work_queue="store-{key}",
        queue_options={"dead_letter": None},
    )


async def publish(url: str, keys: int, per_key: int, forever: bool = False) -> float:
    """Publish ``keys`` × ``per_key`` stamped messages, one per transaction (round robin
    over the keys); with ``forever``, keep going until killed. Returns msgs/s."""
    async with await fairq.connect(url) as broker:
        a = broker.attention(DOMAIN)
        t0 = time.perf_counter()
        n = 0
        while True:
            for _ in range(per_key):
                for k in range(keys):
                    body = orjson.dumps({"t": time.time(), "pad": "x" * 160})
                    await a.publish(f"k{k}", body)
                    n += 1
                    if n == 200 and forever:
                        print("publishing", flush=True)
            if not forever:
                return n / (time.perf_counter() - t0)


def _spawn(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([p for p in (env.get("PYTHONPATH"), str(ROOT)) if p])
    return subprocess.Popen(
        [sys.executable, "-m", "bench.sqlite_contention", *args],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


async def lock_wait(tmp: Path, seconds: float) -> dict[str, float]:
    """A tight-loop publisher process beside this one's single sends."""
    url = f"sqlite:///{tmp / 'lockwait.db'}"
    async with await fairq.connect(url) as broker:
        await _declare(broker)
        side = await broker.declare_queue("side")
        pub = _spawn("_publish", url, "50", "1", "forever")
        try:
            assert pub.stdout is not None
            line = await asyncio.to_thread(pub.stdout.readline)
            assert line.strip() == "publishing", line
            waits: list[float] = []
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                t0 = time.monotonic()
                await side.send(b"mine")
                waits.append(time.monotonic() - t0)
                await asyncio.sleep(0.002)
            published = sum(k.backlog for k in await broker.attention(DOMAIN).key_stats(top=100))
        finally:
            pub.kill()
            pub.wait()
    return {
        "sends": len(waits),
        "p50_ms": _pct(waits, 0.5) * 1000,
        "p99_ms": _pct(waits, 0.99) * 1000,
        "max_ms": max(waits) * 1000,
        "publisher_msgs": published,
    }


async def burst(tmp: Path, mode: str, keys: int, per_key: int, run: int) -> dict[str, float]:
    """The burst with the publisher ``in-process`` or ``cross-process``."""
    url = f"sqlite:///{tmp / f'burst-{mode}-{run}.db'}"
    total = keys * per_key
    waits: list[float] = []
    done = asyncio.Event()
    async with await fairq.connect(url) as broker:
        await _declare(broker)
        worker = fairq.Worker(broker, concurrency=WORKERS, handle_signals=False, poll_wait=1.0)

        @worker.attention(DOMAIN)
        async def handle(msg: fairq.Received) -> None:
            waits.append(time.time() - orjson.loads(msg.body)["t"])
            await asyncio.sleep(HANDLER_S)
            if len(waits) >= total:
                done.set()

        task = asyncio.create_task(worker.run())
        await asyncio.sleep(0.3)  # the worker is up and idle
        t0 = time.perf_counter()
        if mode == "in-process":
            rate = await publish(url, keys, per_key)
        else:
            pub = _spawn("_publish", url, str(keys), str(per_key))
            out, _ = await asyncio.to_thread(pub.communicate)
            rate = float(out.strip().splitlines()[-1])
        await asyncio.wait_for(done.wait(), 120)
        elapsed = time.perf_counter() - t0
        worker.stop()
        await task
    return {
        "messages": total,
        "publish_msgs_s": rate,
        "drain_s": elapsed,
        "p50_ms": _pct(waits, 0.5) * 1000,
        "p99_ms": _pct(waits, 0.99) * 1000,
        "max_ms": max(waits) * 1000,
    }


def _median(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=args.tmpdir) as d:
        tmp = Path(d)
        runs: dict[str, list[dict[str, float]]] = {
            "lock wait": [],
            "in-process": [],
            "cross-process": [],
        }
        for r in range(args.runs):
            runs["lock wait"].append(await lock_wait(tmp, args.seconds))
            for mode in ("in-process", "cross-process"):
                runs[mode].append(await burst(tmp, mode, args.keys, args.per_key, r))
            print(f"run {r + 1}/{args.runs} done", file=sys.stderr)
    med = {name: _median(rows) for name, rows in runs.items()}
    ratio = med["cross-process"]["p99_ms"] / med["in-process"]["p99_ms"]
    return {
        "label": args.label,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average": os.getloadavg()[0],
        "params": {
            "keys": args.keys,
            "per_key": args.per_key,
            "runs": args.runs,
            "workers": WORKERS,
            "handler_ms": HANDLER_S * 1000,
        },
        "median": med,
        "runs": runs,
        "p99_cross_over_in": ratio,
    }


def _table(res: dict[str, Any]) -> str:
    m = res["median"]
    lw = m["lock wait"]
    lines = [
        "| scenario | p50 ms | p99 ms | max ms | notes |",
        "|---|--:|--:|--:|---|",
        f"| lock wait beside a tight-loop publisher process | {lw['p50_ms']:.2f} | "
        f"{lw['p99_ms']:.2f} | {lw['max_ms']:.1f} | {lw['sends']:.0f} sends in "
        f"{res['params'].get('seconds', 0) or ''}s; publisher stored {lw['publisher_msgs']:.0f} |",
    ]
    for mode in ("in-process", "cross-process"):
        b = m[mode]
        lines.append(
            f"| burst, publisher {mode} | {b['p50_ms']:.1f} | {b['p99_ms']:.1f} | "
            f"{b['max_ms']:.1f} | {b['messages']:.0f} msgs, published at "
            f"{b['publish_msgs_s']:,.0f}/s, drained in {b['drain_s']:.2f} s |"
        )
    lines.append(
        f"\ncross-process / in-process burst p99: {res['p99_cross_over_in']:.2f}x (target <= 3)"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_publish":
        _, _, url, keys, per_key, *rest = sys.argv
        rate = asyncio.run(publish(url, int(keys), int(per_key), forever=bool(rest)))
        print(rate, flush=True)
        sys.exit(0)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keys", type=int, default=200, help="small keys in the burst")
    ap.add_argument("--per-key", type=int, default=5, help="messages per key")
    ap.add_argument("--seconds", type=float, default=2.0, help="of the lock-wait phase")
    ap.add_argument("--tmpdir", default=None)
    ap.add_argument("--label", default="")
    ap.add_argument("--json", default=str(ROOT / "bench/results/sqlite-contention.json"))
    a = ap.parse_args()
    result = asyncio.run(main(a))
    result["params"]["seconds"] = a.seconds
    Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    print(_table(result))
