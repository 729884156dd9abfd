"""Attention on Redis at scale: ``python -m bench.attention_redis [--keys 1000000]``.

On a private redis-server (no persistence, a free port of 16400-16499):

1. one work message for each of ``--keys`` keys (published by 64 concurrent tasks):
   publish rate, and Redis memory per key (``used_memory`` before and after);
2. a noisy key gets ``--noisy`` messages on top;
3. one fairq ``Worker`` (no-op handler, concurrency 64) drains the domain: take rate
   (slices per second, messages per second), and when the last small key was served
   compared with the noisy key's end (a noisy key must not hold the small ones back);
4. idle cost: with every queue empty, the worker idles for ``--idle-seconds``; the
   commands Redis ran meanwhile (``INFO commandstats``) divided by the keys — 0 per key
   is the goal (no polling of work queues).

Results go to ``bench/results/attention-redis.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

import fairq

from .queues import RESULTS, ROOT

sys.path.insert(0, str(ROOT / "tests"))
from redis_servers import RedisServer


def _commands(r: redis.Redis) -> int:
    return sum(int(v["calls"]) for v in r.info("commandstats").values())


async def _run(
    url: str, r: redis.Redis, keys: int, noisy: int, idle_seconds: float
) -> dict[str, Any]:
    out: dict[str, Any] = {"keys": keys, "noisy": noisy}
    async with await fairq.connect(url) as broker:
        plans = {"basic": fairq.Plan(max_concurrency=2, max_messages=50, max_time=5.0)}
        market = await broker.declare_attention(
            "market", plans=plans, work_queue="{domain}.{key}.work"
        )
        base = int(r.info("memory")["used_memory"])
        sem = asyncio.Semaphore(64)
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            async with sem:
                await market.publish(f"k{i}", b"x" * 200)

        for start in range(0, keys, 10_000):
            await asyncio.gather(*(one(i) for i in range(start, min(keys, start + 10_000))))
        out["publish_per_s"] = keys / (time.perf_counter() - t0)
        full = int(r.info("memory")["used_memory"])
        out["bytes_per_key"] = (full - base) / keys  # the key, its queue and its message
        for start in range(0, noisy, 1000):
            await market.publish_batch(
                "noisy", [fairq.Outgoing(b"y" * 200)] * min(1000, noisy - start)
            )
        total = keys + noisy
        done = asyncio.Event()
        count = 0
        small_done_at = noisy_done_at = 0.0
        small_left = keys
        noisy_left = noisy
        worker = fairq.Worker(broker, concurrency=64, handle_signals=False, poll_wait=1.0)
        t_start = time.perf_counter()

        @worker.attention("market")
        async def handle(msg: fairq.Received) -> None:
            nonlocal count, small_left, noisy_left, small_done_at, noisy_done_at
            count += 1
            if msg.key == "noisy":
                noisy_left -= 1
                if noisy_left == 0:
                    noisy_done_at = time.perf_counter() - t_start
            else:
                small_left -= 1
                if small_left == 0:
                    small_done_at = time.perf_counter() - t_start
            if count >= total:
                done.set()

        task = asyncio.create_task(worker.run())
        await asyncio.wait_for(done.wait(), 3600)
        seconds = time.perf_counter() - t_start
        stats = await market.stats()
        out["drain_seconds"] = seconds
        out["messages_per_s"] = total / seconds
        out["slices_per_s"] = stats.slices / seconds if stats.slices else None
        out["processed"] = stats.processed
        out["small_keys_done_s"] = small_done_at
        out["noisy_key_done_s"] = noisy_done_at
        await asyncio.sleep(2.0)  # the last slices end
        before = _commands(r)
        await asyncio.sleep(idle_seconds)
        idle = _commands(r) - before
        out["idle_seconds"] = idle_seconds
        out["idle_commands"] = idle
        out["idle_commands_per_key"] = idle / (keys + 1)
        worker.stop()
        await task
        out["after_drain_bytes_per_key"] = (int(r.info("memory")["used_memory"]) - base) / keys
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.attention_redis")
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--noisy", type=int, default=100_000)
    p.add_argument("--idle-seconds", type=float, default=20.0)
    a = p.parse_args(argv)
    server = RedisServer(Path(tempfile.mkdtemp(prefix="fairq-att-")), None, "--appendonly", "no")
    server.start()
    try:
        r = redis.Redis(port=server.port)
        doc = asyncio.run(_run(f"{server.url}?prefix=a:", r, a.keys, a.noisy, a.idle_seconds))
        r.close()
    finally:
        server.stop()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "attention-redis.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
