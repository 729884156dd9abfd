"""The single-purpose measurements of ``bench/attention.py`` (issue 4's acceptance beside
the strategies): one backlogged key under attention vs a plain queue consumer, tenant
shares (many keys vs one), and a rate-limited key — each on a fresh namespace of the
engine the bench runs on."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import fairq

from .engines import Counting, Engine, fresh

if TYPE_CHECKING:
    from .attention import Scenario


def started_worker(worker: fairq.Worker) -> Callable[[], Awaitable[None]]:
    """Run ``worker`` in a task; the returned coroutine function stops it and waits."""
    task = asyncio.create_task(worker.run())

    async def stop() -> None:
        worker.stop()
        await task

    return stop


async def one_key_throughput(sc: Scenario, n: int, engine: Engine) -> dict[str, float]:
    """Messages/s of one backlogged key under attention vs one queue under a plain Worker,
    same backend, same 8-way worker, a handler that does nothing."""
    rates: dict[str, float] = {}
    for kind in ("plain", "attention"):
        async with fresh(engine, f"single-{kind}") as url:
            broker = await fairq.connect(url)
            worker = fairq.Worker(
                broker, concurrency=sc.workers, handle_signals=False, poll_wait=0.2
            )
            done = 0
            if kind == "plain":
                q = await broker.declare_queue("one", dead_letter=None)
                for i in range(0, n, 1000):
                    await q.send_batch([fairq.Outgoing(b"x") for _ in range(min(1000, n - i))])

                @worker.queue("one", concurrency=sc.workers)
                async def h(msg: fairq.Received) -> None:
                    nonlocal done
                    done += 1
            else:
                a = await broker.declare_attention(
                    "one", plans={"basic": fairq.Plan(1, 1000, 20.0)}
                )
                for i in range(0, n, 1000):
                    await a.publish_batch(
                        "key", [fairq.Outgoing(b"x") for _ in range(min(1000, n - i))]
                    )

                @worker.attention("one")
                async def h2(msg: fairq.Received) -> None:
                    nonlocal done
                    done += 1

            started = time.monotonic()
            stop = started_worker(worker)
            while done < n:  # noqa: ASYNC110 - a bounded progress poll of the benchmark
                await asyncio.sleep(0.01)
            rates[kind] = n / (time.monotonic() - started)
            await stop()
            await broker.close()
    return rates


async def tenant_shares(
    sc: Scenario, a_keys: int, seconds: float, engine: Engine
) -> dict[str, float]:
    """Tenant A spreads its backlog over many keys, tenant B has one key; equal plans."""
    async with fresh(engine, "tenants") as url:
        broker = await fairq.connect(url)
        a = await broker.declare_attention(
            "tenants", plans={"basic": fairq.Plan(sc.workers, 50, 20.0)}
        )
        for i in range(a_keys):
            await a.set_resource(f"a{i}", tenant="A")
            await a.publish_batch(f"a{i}", [fairq.Outgoing(b"A") for _ in range(200)])
        await a.set_resource("b0", tenant="B")
        for i in range(0, sc.tenant_b_jobs, 1000):  # more than it can finish: both stay backlogged
            n = min(1000, sc.tenant_b_jobs - i)
            await a.publish_batch("b0", [fairq.Outgoing(b"B") for _ in range(n)])
        counts: Counter[str] = Counter()
        worker = fairq.Worker(broker, concurrency=sc.workers, handle_signals=False, poll_wait=0.2)

        @worker.attention("tenants")
        async def h(msg: fairq.Received) -> None:
            counts[msg.text()] += 1
            await asyncio.sleep(sc.job_seconds)

        stop = started_worker(worker)
        await asyncio.sleep(seconds)  # both stay backlogged throughout
        await stop()
        busy: dict[str, float] = {}
        with contextlib.suppress(fairq.Unsupported):  # the domain's own worker-time count
            busy = {t.tenant: t.busy for t in await a.tenant_stats()}
        await broker.close()
    assert counts["B"] < sc.tenant_b_jobs and counts["A"] < a_keys * 200, "a tenant ran out"
    out = {"A": counts["A"], "B": counts["B"], "B/A": counts["B"] / max(1, counts["A"])}
    if busy.get("A"):  # worker time (what the scheduler shares) beside messages
        out["busy A"], out["busy B"] = busy["A"], busy.get("B", 0.0)
        out["busy B/A"] = busy.get("B", 0.0) / busy["A"]
    return out


async def rate_limited(
    sc: Scenario, rate: float, seconds: float, engine: Engine
) -> dict[str, float]:
    """A key with rate=50 under 8 workers: messages handled per second, and backend calls
    made while it waits for its bucket (no spinning)."""
    async with fresh(engine, "rate") as url:
        broker = await fairq.connect(url)
        burst = 10.0
        a = await broker.declare_attention(
            "limited", plans={"basic": fairq.Plan(sc.workers, 100, 20.0, rate=rate, burst=burst)}
        )
        await a.publish_batch("api", [fairq.Outgoing(b"x") for _ in range(int(rate * seconds * 2))])
        done = 0
        worker = fairq.Worker(broker, concurrency=sc.workers, handle_signals=False, poll_wait=0.5)

        @worker.attention("limited")
        async def h(msg: fairq.Received) -> None:
            nonlocal done
            done += 1

        counting = Counting(broker.backend)
        stop = started_worker(worker)
        await asyncio.sleep(seconds)
        handled = done
        await stop()
        await broker.close()
    return {
        "handled": handled,
        "expected": rate * seconds + burst,
        "per_s": (handled - burst) / seconds,
        "takes_per_s": counting.calls["attention_take"] / seconds,
        "calls_per_s": sum(counting.calls.values()) / seconds,
    }
