"""Child processes for the reliability tests, run as ``python procs.py ROLE DB ...``.

Each role prints one line per event on stdout (flushed) so the parent can follow it
and kill it at the worst moment.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Any

import fairq


async def hold_leases(url: str, n: int) -> None:
    """Lease ``n`` messages, say so, and never ack them."""
    async with await fairq.connect(url) as broker:
        got = await broker.queue("work").receive(max_messages=n, visibility_timeout=1.0)
        print("leased", " ".join(m.id for m in got), flush=True)
        await asyncio.sleep(3600)


async def send_batches(url: str, size: int) -> None:
    """Send batches forever; print each batch number once send_batch has returned."""
    async with await fairq.connect(url) as broker:
        q = broker.queue("work")
        i = 0
        while True:
            await q.send_batch(
                [fairq.Outgoing(b"x" * 100, attributes={"batch": str(i)}) for _ in range(size)]
            )
            print("sent", i, flush=True)
            i += 1


async def publish_attention(url: str, keys: int) -> None:
    """Publish to attention keys forever; print each round once it has returned."""
    async with await fairq.connect(url) as broker:
        a = broker.attention("market")
        i = 0
        while True:
            for k in range(keys):
                await a.publish_batch(f"store-{k}", [fairq.Outgoing(str(i).encode())] * 3)
            print("round", i, flush=True)
            i += 1


async def publish_then_die(url: str, keys: int) -> None:
    """Publish one message to each of ``keys`` attention keys, then die (kill -9) inside a
    publish_batch of three to ``store-0``: on RabbitMQ after its tickets and signal are in
    the store, before its messages reach RabbitMQ."""
    async with await fairq.connect(url) as broker:
        a = broker.attention("market")
        for k in range(keys):
            await a.publish(f"store-{k}", b"ok")

        async def die(*_: Any) -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        broker.backend._publish_new = die  # type: ignore[attr-defined]
        print("dying", flush=True)
        await a.publish_batch("store-0", [fairq.Outgoing(b"lost")] * 3)


async def consume(url: str, seconds: float, hold: float = 0.0) -> None:
    """Long-poll and ack for ``seconds``; print each message's id and its latency (on
    receipt), then hold it ``hold`` seconds before the ack."""
    async with await fairq.connect(url) as broker:
        q = broker.queue("work")
        print("ready", flush=True)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for m in await q.receive(wait=min(1.0, max(0.01, end - time.monotonic()))):
                latency = time.time() - float(m.body)
                print("got", m.id, f"{latency:.4f}", flush=True)
                if hold:
                    await asyncio.sleep(hold)
                await m.ack()


async def consume_slowly(url: str, seconds: float) -> None:
    """``consume``, each message held 0.15 s: a consumer busy with one message leaves the
    next send (0.1 s later in test_crash) to the other consumer, so both get work however
    the engine orders two waiting receivers."""
    await consume(url, seconds, hold=0.15)


async def attention_worker(url: str, slots: int) -> None:
    """Handle domain "market" with a Worker of ``slots`` (1 ms handlers); print a line
    every 100 messages handled."""
    async with await fairq.connect(url) as broker:
        worker = fairq.Worker(broker, concurrency=slots, handle_signals=False, poll_wait=0.2)
        handled = 0

        @worker.attention("market")
        async def handle(msg: fairq.Received) -> None:
            nonlocal handled
            await asyncio.sleep(0.001)
            handled += 1
            if handled % 100 == 0:
                print("handled", handled, flush=True)

        await worker.run()


if __name__ == "__main__":
    role, url, arg = sys.argv[1], sys.argv[2], sys.argv[3]
    main = {
        "hold": hold_leases,
        "send": send_batches,
        "consume": consume,
        "consume-slowly": consume_slowly,
        "attention": publish_attention,
        "attention-worker": attention_worker,
        "attention-die": publish_then_die,
    }[role]
    asyncio.run(main(url, float(arg) if role.startswith("consume") else int(arg)))  # type: ignore[operator]
