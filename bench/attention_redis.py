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

``--shards N`` declares the domain with ``shards=N`` (work queues
``{domain}-{shard}.{key}.work``). The drain also reports the scripts Redis ran per message
(``EVALSHA`` in ``INFO commandstats``): a small key's one message is one slice, a take
and an end.

``--drain-seconds T`` bounds step 3 (at 1,000,000 keys a full drain takes hours on a
small machine): the worker runs for T seconds and the rates and the small/noisy split of
what it served are reported; steps 4 and the after-drain memory are then skipped.
``--redis-config`` passes settings to redis-server (``"stream-node-max-bytes 512"``).
``--idle-only`` gives each key its state (``set_resource``) and no message, and measures
only the idle phase (with a worker attached; for a domain too big to drain here).
``--cluster`` runs on a 3-master Redis Cluster of its own (ports 17200-17202) instead,
and reports each node's share of the memory (use it with ``--shards``).

Results go to ``bench/results/attention-redis.json`` (``--out`` to name another file).
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
from redis_servers import RedisCluster, RedisServer


class _Nodes:
    """INFO summed over the nodes (one, or a Cluster's masters)."""

    def __init__(self, ports: list[int]) -> None:
        self.clients = [redis.Redis(port=p) for p in ports]

    def info(self, section: str) -> dict[str, Any]:
        parts = [c.info(section) for c in self.clients]
        if section == "memory":
            return {"used_memory": sum(int(p["used_memory"]) for p in parts)}
        out: dict[str, Any] = {}
        for part in parts:
            for k, v in part.items():
                row = out.setdefault(k, {"calls": 0, "usec": 0})
                row["calls"] += int(v["calls"])
                row["usec"] += int(v["usec"])
        return out

    def per_node_memory(self) -> list[int]:
        return [int(c.info("memory")["used_memory"]) for c in self.clients]

    def close(self) -> None:
        for c in self.clients:
            c.close()


_PUBLISHER = """
import asyncio, sys, time, fairq

async def main(url, a, b, idle_only):
    async with await fairq.connect(url) as broker:
        market = broker.attention("market")
        sem = asyncio.Semaphore(64)
        t0 = time.perf_counter()

        async def one(i):
            async with sem:
                if idle_only:  # the key's state, no message
                    await market.set_resource(f"k{i}", plan="basic")
                else:
                    await market.publish(f"k{i}", b"x" * 200)

        for start in range(a, b, 10_000):
            await asyncio.gather(*(one(i) for i in range(start, min(b, start + 10_000))))
            if (start - a) % 100_000 == 0:
                rate = (start + 10_000 - a) / (time.perf_counter() - t0)
                print(f"  [{a}] published {start + 10_000 - a:,} keys, {rate:,.0f}/s", flush=True)

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"))
"""


def _commands(r: _Nodes) -> int:
    return sum(int(v["calls"]) for v in r.info("commandstats").values())


def _usec(r: _Nodes) -> int:
    """Redis's time in scripts (a script's time includes the commands it calls)."""
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in ("evalsha", "eval"))


def _by_command(r: _Nodes) -> dict[str, tuple[int, int]]:
    """Calls and microseconds per command (a script's inner commands count on their own)."""
    return {
        name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for name, v in r.info("commandstats").items()
    }


def _top_commands(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], n: int
) -> list[dict[str, Any]]:
    """The ``n`` commands Redis spent most time in between two readings, per message."""
    rows = []
    for name, (calls, usec) in after.items():
        c0, u0 = before.get(name, (0, 0))
        rows.append((usec - u0, calls - c0, name))
    rows.sort(reverse=True)
    return [{"command": name, "usec": usec, "calls": calls} for usec, calls, name in rows[:n]]


def _scripts(r: _Nodes) -> int:
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


async def _run(
    url: str,
    r: _Nodes,
    keys: int,
    noisy: int,
    idle_seconds: float,
    drain_seconds: float | None = None,
    publishers: int = 1,
    shards: int = 1,
    idle_only: bool = False,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "keys": keys,
        "noisy": noisy,
        "drain_bound_s": drain_seconds,
        "shards": shards,
    }
    async with await fairq.connect(url) as broker:
        plans = {"basic": fairq.Plan(max_concurrency=2, max_messages=50, max_time=5.0)}
        sharded: dict[str, Any] = {"shards": shards} if shards > 1 else {}
        market = await broker.declare_attention(
            "market",
            plans=plans,
            work_queue="{domain}-{shard}.{key}.work" if shards > 1 else "{domain}.{key}.work",
            **sharded,
        )
        base = int(r.info("memory")["used_memory"])
        sem = asyncio.Semaphore(64)
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            async with sem:
                if idle_only:
                    await market.set_resource(f"k{i}", plan="basic")
                else:
                    await market.publish(f"k{i}", b"x" * 200)

        if publishers > 1:  # processes of their own, each a range of keys
            step = -(-keys // publishers)
            procs = [
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-c",
                    _PUBLISHER,
                    url,
                    str(a),
                    str(min(keys, a + step)),
                    "1" if idle_only else "0",
                )
                for a in range(0, keys, step)
            ]
            for proc in procs:
                if await proc.wait() != 0:
                    raise RuntimeError("a publisher process failed")
        else:
            for start in range(0, keys, 10_000):
                await asyncio.gather(*(one(i) for i in range(start, min(keys, start + 10_000))))
                if start % 100_000 == 0:
                    rate = (start + 10_000) / (time.perf_counter() - t0)
                    print(f"  published {start + 10_000:,} keys, {rate:,.0f}/s", flush=True)
        out["publish_per_s"] = keys / (time.perf_counter() - t0)
        out["publishers"] = publishers
        full = int(r.info("memory")["used_memory"])
        out["bytes_per_key"] = (full - base) / keys  # the key, its queue and its message
        if idle_only:
            return await _idle(broker, r, out, keys, idle_seconds)
        if len(r.clients) > 1:
            out["per_node_bytes"] = r.per_node_memory()
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

        scripts_before = _scripts(r)
        usec_before = _usec(r)
        by_command_before = _by_command(r)
        cpu_before = time.process_time()
        task = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(done.wait(), drain_seconds or 3600)
        except TimeoutError:
            if drain_seconds is None:
                raise
        seconds = time.perf_counter() - t_start
        scripts = _scripts(r) - scripts_before
        # what a message costs, less at the mercy of a busy machine than the rate: Redis's
        # own time (INFO commandstats) and this process's CPU time (the worker's)
        out["redis_us_per_message"] = (_usec(r) - usec_before) / max(1, count)
        # where Redis's time went (scripts' inner commands by name): what to make cheaper
        out["redis_top_commands"] = _top_commands(by_command_before, _by_command(r), 10)
        out["worker_cpu_us_per_message"] = (time.process_time() - cpu_before) * 1e6 / max(1, count)
        stats = await market.stats()
        out["scripts"] = scripts
        out["scripts_per_message"] = scripts / max(1, count)
        out["drain_seconds"] = seconds
        out["served"] = count
        out["messages_per_s"] = count / seconds
        out["processed"] = stats.processed
        out["small_served"] = keys - small_left
        out["noisy_served"] = noisy - noisy_left
        out["small_keys_done_s"] = small_done_at
        out["noisy_key_done_s"] = noisy_done_at
        if count < total:  # bounded: no idle phase, the queues are not empty
            worker.stop()
            await task
            return out
        await asyncio.sleep(2.0)  # the last slices end
        await _count_idle(r, out, keys, idle_seconds)
        worker.stop()
        await task
        out["after_drain_bytes_per_key"] = (int(r.info("memory")["used_memory"]) - base) / keys
    return out


async def _count_idle(r: _Nodes, out: dict[str, Any], keys: int, seconds: float) -> None:
    """The commands Redis runs while the domain idles, per key and by name."""
    before = _commands(r)
    before_by = r.info("commandstats")
    await asyncio.sleep(seconds)
    idle = _commands(r) - before
    after_by = r.info("commandstats")
    out["idle_seconds"] = seconds
    out["idle_commands"] = idle
    out["idle_commands_per_key"] = idle / (keys + 1)
    out["idle_by_command"] = {
        k.removeprefix("cmdstat_"): int(v["calls"]) - int(before_by.get(k, {}).get("calls", 0))
        for k, v in after_by.items()
        if int(v["calls"]) != int(before_by.get(k, {}).get("calls", 0))
    }


async def _idle(
    broker: fairq.Broker, r: _Nodes, out: dict[str, Any], keys: int, seconds: float
) -> dict[str, Any]:
    """``--idle-only``: a worker (concurrency 64, reconciling every 30 s) on the domain of
    idle keys; what Redis runs meanwhile."""
    worker = fairq.Worker(broker, concurrency=64, handle_signals=False, poll_wait=1.0)

    @worker.attention("market")
    async def handle(msg: fairq.Received) -> None:
        raise AssertionError("an idle domain has no work")

    task = asyncio.create_task(worker.run())
    await asyncio.sleep(5.0)  # started: its first look and reconcile are done
    await _count_idle(r, out, keys, seconds)
    worker.stop()
    await task
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.attention_redis")
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--noisy", type=int, default=100_000)
    p.add_argument("--idle-seconds", type=float, default=20.0)
    p.add_argument("--drain-seconds", type=float, help="bound the drain (see above)")
    p.add_argument("--redis-config", default="", help='e.g. "stream-node-max-bytes 512"')
    p.add_argument("--out", default="attention-redis.json")
    p.add_argument("--publishers", type=int, default=1, help="publisher processes")
    p.add_argument("--shards", type=int, default=1, help="shards of the domain")
    p.add_argument("--cluster", action="store_true", help="a 3-master Cluster of its own")
    p.add_argument(
        "--idle-only",
        action="store_true",
        help="keys with their state and no message (set_resource), then only the idle phase",
    )
    a = p.parse_args(argv)
    extra = [f"--{w}" if i % 2 == 0 else w for i, w in enumerate(a.redis_config.split())]
    workdir = Path(tempfile.mkdtemp(prefix="fairq-att-"))
    server: RedisServer | RedisCluster
    if a.cluster:
        server = RedisCluster(workdir, ports=[17200, 17201, 17202]).start()
        ports = [n.port for n in server.nodes]
    else:
        server = RedisServer(workdir, None, "--appendonly", "no", *extra).start()
        ports = [server.port]
    try:
        r = _Nodes(ports)
        doc = asyncio.run(
            _run(
                f"{server.url}?prefix=a:",
                r,
                a.keys,
                a.noisy,
                a.idle_seconds,
                a.drain_seconds,
                a.publishers,
                a.shards,
                a.idle_only,
            )
        )
        doc["redis_config"] = a.redis_config
        doc["cluster"] = a.cluster
        r.close()
    finally:
        server.stop()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / a.out
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
