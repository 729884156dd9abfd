"""Queue benchmarks on RabbitMQ: fairq's ``amqp://`` backend beside a raw aio-pika loop with
the same publisher confirms, manual acks and prefetch, and beside the RabbitMQ brokers of
Dramatiq, Celery (``acks_late``) and taskiq-aio-pika, in one run.

    python -m bench.queues --backend amqp              # N=20,000, median of 3 runs
    python -m bench.queues --backend amqp --quick      # N=3,000, 1 run
    python -m bench.queues --backend amqp --systems fairq,"raw aio-pika" --runs 5

Every system gets a fresh vhost on the local broker (``--url``, default guest@127.0.0.1),
created and deleted through the management API, and ~200-byte JSON bodies. Phases:

* **send** — N messages in batches of 100, each batch waiting for its publisher confirms
  (fairq ``send_batch``; raw: 100 ``basic.publish`` then their confirms);
* **receive+ack** — drain the N messages, batches of 100 (fairq ``receive(100)`` +
  ``ack_batch``; raw: a consumer with prefetch 200 acking each delivery);
* **end to end** — N / (send seconds + receive seconds);
* **worker** — N messages already queued (untimed), then the time until a worker with 16
  slots has run a no-op handler on each of them and acked it: fairq's ``Worker``,
  Dramatiq's ``Worker`` (16 threads), Celery's worker (threads pool, 16, ``acks_late``)
  and taskiq's ``Receiver`` (16 async tasks, ack when executed).

The runs of the systems are interleaved; each figure is the median of ``--runs`` runs, and
the ratios are taken within the same run set. Results go to ``bench/results/amqp.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fairq

from .queues import RESULTS, machine, make_bodies

QUEUE = "bench"
BATCH = 100
PREFETCH = 200  # fairq's default prefetch, given to the raw loop too
SLOTS = 16
RAW, FAIRQ, DRAMATIQ, CELERY, TASKIQ = "raw aio-pika", "fairq", "dramatiq", "celery", "taskiq"
AIORMQ = "raw aiormq"  # aio-pika's own driver, which fairq drives directly: the lower bound
SYSTEMS = (RAW, AIORMQ, FAIRQ, DRAMATIQ, CELERY, TASKIQ)
SEND, RECV, E2E, WORKER = "send", "receive+ack", "end to end", "worker, no-op handlers"


@dataclass
class Measured:
    n: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.n / self.seconds if self.seconds > 0 else 0.0


class Vhosts:
    """Fresh vhosts on the benchmark's broker, deleted when done."""

    def __init__(self, base: str) -> None:
        from fairq.backends.amqp.management import Management

        self.base = base.rstrip("/")
        self.api = Management("http://127.0.0.1:15672", "guest", "guest")
        self.made: list[str] = []

    def new(self, system: str) -> str:
        name = f"fairq-bench-{system.replace(' ', '-')}-{uuid.uuid4().hex[:6]}"
        self.api.add_vhost(name, "guest")
        self.made.append(name)
        return name

    def url(self, vhost: str, scheme: str = "amqp") -> str:
        return f"{scheme}://{self.base.split('://', 1)[1]}/{vhost}"

    def drop(self, vhost: str) -> None:
        self.api.delete_vhost(vhost)
        self.made.remove(vhost)

    def close(self) -> None:
        for v in list(self.made):
            self.drop(v)


# -- raw aio-pika: the engine yardstick ----------------------------------------------------
async def raw_phases(url: str, bodies: list[bytes]) -> tuple[Measured, Measured]:
    import aio_pika

    conn = await aio_pika.connect(url)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        x = ch.default_exchange
        gc.collect()
        t0 = time.perf_counter()
        for i in range(0, len(bodies), BATCH):
            await asyncio.gather(
                *[
                    x.publish(
                        aio_pika.Message(
                            b, delivery_mode=aio_pika.DeliveryMode.PERSISTENT, message_id=str(i + j)
                        ),
                        routing_key=QUEUE,
                    )
                    for j, b in enumerate(bodies[i : i + BATCH])
                ]
            )
        sent = Measured(len(bodies), time.perf_counter() - t0)
        rch = await conn.channel()
        await rch.set_qos(prefetch_count=PREFETCH)
        q = await rch.get_queue(QUEUE)
        gc.collect()
        got = 0
        t0 = time.perf_counter()
        async with q.iterator() as it:
            async for m in it:
                await m.ack()
                got += 1
                if got == len(bodies):
                    break
        received = Measured(got, time.perf_counter() - t0)
        return sent, received
    finally:
        await conn.close()


async def aiormq_phases(url: str, bodies: list[bytes]) -> tuple[Measured, Measured]:
    import aiormq
    from pamqp.commands import Basic

    conn = await aiormq.connect(url)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await ch.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        gc.collect()
        t0 = time.perf_counter()
        for i in range(0, len(bodies), BATCH):
            await asyncio.gather(
                *[
                    ch.basic_publish(
                        b,
                        routing_key=QUEUE,
                        properties=Basic.Properties(delivery_mode=2, message_id=str(i + j)),
                    )
                    for j, b in enumerate(bodies[i : i + BATCH])
                ]
            )
        sent = Measured(len(bodies), time.perf_counter() - t0)
        rch = await conn.channel(publisher_confirms=False)
        await rch.basic_qos(prefetch_count=PREFETCH)
        done = asyncio.Event()
        got = [0]

        async def on_message(m: Any) -> None:
            await rch.basic_ack(m.delivery.delivery_tag, wait=False)
            got[0] += 1
            if got[0] == len(bodies):
                done.set()

        gc.collect()
        t0 = time.perf_counter()
        await rch.basic_consume(QUEUE, on_message, no_ack=False)
        await done.wait()
        received = Measured(got[0], time.perf_counter() - t0)
        return sent, received
    finally:
        await conn.close()


# -- fairq ---------------------------------------------------------------------------------
def fairq_url(url: str, store: str) -> str:
    return f"{url}?store=sqlite:///{store}"


async def fairq_phases(url: str, bodies: list[bytes]) -> tuple[Measured, Measured]:
    broker = await fairq.connect(url)
    try:
        q = await broker.declare_queue(QUEUE)
        parts = [
            [fairq.Outgoing(b) for b in bodies[i : i + BATCH]] for i in range(0, len(bodies), BATCH)
        ]
        gc.collect()
        t0 = time.perf_counter()
        for out in parts:
            await q.send_batch(out)
        sent = Measured(len(bodies), time.perf_counter() - t0)
        gc.collect()
        got = 0
        t0 = time.perf_counter()
        while got < len(bodies):
            msgs = await q.receive(max_messages=BATCH, wait=1.0)
            if not msgs:
                raise RuntimeError(f"fairq: queue empty after {got} of {len(bodies)}")
            await q.ack_batch([m.receipt for m in msgs])
            got += len(msgs)
        received = Measured(got, time.perf_counter() - t0)
        return sent, received
    finally:
        await broker.close()


async def fairq_worker(url: str, bodies: list[bytes]) -> Measured:
    n = len(bodies)
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue(QUEUE)
        for i in range(0, n, BATCH):
            await q.send_batch([fairq.Outgoing(b) for b in bodies[i : i + BATCH]])
        worker = fairq.Worker(broker, concurrency=SLOTS, handle_signals=False, grace=5.0)
        done = asyncio.Event()
        count = [0]

        @worker.queue(QUEUE, concurrency=SLOTS)
        async def handle(msg: fairq.Received) -> None:
            count[0] += 1
            if count[0] == n:
                done.set()

        gc.collect()
        t0 = time.perf_counter()
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(done.wait(), 600)
        worker.stop()  # returns once the last acks are sent
        await asyncio.wait_for(running, 30)
        seconds = time.perf_counter() - t0
        return Measured(n, seconds)


# -- peers ---------------------------------------------------------------------------------
def dramatiq_worker(url: str, bodies: list[bytes]) -> Measured:
    import dramatiq
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    broker = RabbitmqBroker(url=url, confirm_delivery=True)
    dramatiq.set_broker(broker)
    n = len(bodies)
    count = [0]
    lock = threading.Lock()
    done = threading.Event()

    def noop(body: str) -> None:
        with lock:
            count[0] += 1
            if count[0] == n:
                done.set()

    actor = dramatiq.actor(noop, broker=broker, queue_name=QUEUE, max_retries=0)
    for b in bodies:
        actor.send(b.decode())
    worker = dramatiq.Worker(broker, worker_threads=SLOTS, worker_timeout=100)
    gc.collect()
    t0 = time.perf_counter()
    worker.start()
    done.wait(600)
    seconds = time.perf_counter() - t0
    worker.stop()
    broker.close()
    return Measured(count[0], seconds)


def celery_worker(url: str, bodies: list[bytes]) -> Measured:
    from celery import Celery
    from celery.contrib.testing.worker import start_worker

    app = Celery("fairq_bench", broker=url.replace("amqp://", "pyamqp://", 1), set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        task_ignore_result=True,
        task_default_queue=QUEUE,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    n = len(bodies)
    count = [0]
    lock = threading.Lock()
    done = threading.Event()

    @app.task(name="noop", acks_late=True)  # type: ignore[untyped-decorator]
    def noop(body: str) -> None:
        with lock:
            count[0] += 1
            if count[0] == n:
                done.set()

    for b in bodies:
        noop.delay(b.decode())
    gc.collect()
    t0 = time.perf_counter()
    with start_worker(
        app,
        concurrency=SLOTS,
        pool="threads",
        perform_ping_check=False,
        loglevel="WARNING",
        shutdown_timeout=60.0,  # its default 10 s failed a run on a busy machine
    ):
        done.wait(600)
        seconds = time.perf_counter() - t0
    return Measured(count[0], seconds)


async def taskiq_worker(url: str, bodies: list[bytes]) -> Measured:
    from taskiq.acks import AcknowledgeType
    from taskiq.receiver import Receiver
    from taskiq_aio_pika import AioPikaBroker

    broker = AioPikaBroker(url=url, qos=2 * SLOTS)
    broker.is_worker_process = True  # else it opens no consuming connection
    n = len(bodies)
    count = [0]
    done = asyncio.Event()

    @broker.task(task_name="noop")
    async def noop(body: str) -> None:
        count[0] += 1
        if count[0] == n:
            done.set()

    await broker.startup()
    try:
        for b in bodies:
            await noop.kiq(b.decode())
        receiver = Receiver(
            broker, max_async_tasks=SLOTS, run_startup=False, ack_type=AcknowledgeType.WHEN_EXECUTED
        )
        finish = asyncio.Event()
        gc.collect()
        t0 = time.perf_counter()
        listening = asyncio.create_task(receiver.listen(finish))
        await asyncio.wait_for(done.wait(), 600)
        seconds = time.perf_counter() - t0
        finish.set()
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
        return Measured(count[0], seconds)
    finally:
        await broker.shutdown()


# -- driver --------------------------------------------------------------------------------
def run_worker(system: str, url: str, store: str, bodies: list[bytes]) -> Measured:
    if system == FAIRQ:
        return asyncio.run(fairq_worker(fairq_url(url, store), bodies))
    if system == DRAMATIQ:
        return dramatiq_worker(url, bodies)
    if system == CELERY:
        return celery_worker(url, bodies)
    return asyncio.run(taskiq_worker(url, bodies))


def run(cfg: argparse.Namespace) -> dict[str, Any]:
    runs: dict[tuple[str, str], list[Measured]] = {}
    vhosts = Vhosts(cfg.url)
    bodies = make_bodies(cfg.n)
    worker_bodies = bodies[: cfg.worker_n]
    tmp = tempfile.mkdtemp(prefix="fairq-bench-amqp-")
    started = time.time()

    def add(system: str, phase: str, m: Measured) -> None:
        runs.setdefault((system, phase), []).append(m)

    try:
        for r in range(1, cfg.runs + 1):
            for system in cfg.systems:
                if system in (RAW, AIORMQ, FAIRQ):
                    v = vhosts.new(system)
                    url = vhosts.url(v)
                    if system == RAW:
                        sent, got = asyncio.run(raw_phases(url, bodies))
                    elif system == AIORMQ:
                        sent, got = asyncio.run(aiormq_phases(url, bodies))
                    else:
                        sent, got = asyncio.run(
                            fairq_phases(fairq_url(url, f"{tmp}/{v}.db"), bodies)
                        )
                    add(system, SEND, sent)
                    add(system, RECV, got)
                    add(system, E2E, Measured(cfg.n, sent.seconds + got.seconds))
                    vhosts.drop(v)
                    _say(
                        f"run {r}/{cfg.runs} {system:<12} send {sent.rate:>8,.0f}/s "
                        f"receive+ack {got.rate:>8,.0f}/s"
                    )
                if system in (RAW, AIORMQ):
                    continue
                v = vhosts.new(system)
                url = vhosts.url(v)
                try:
                    m = run_worker(system, url, f"{tmp}/{v}-w.db", worker_bodies)
                except Exception as exc:
                    if system == FAIRQ:
                        raise
                    # a peer that fails one run loses that run, not the whole bench
                    vhosts.drop(v)
                    _say(f"run {r}/{cfg.runs} {system:<12} worker failed: {exc!r}")
                    continue
                add(system, WORKER, m)
                vhosts.drop(v)
                _say(f"run {r}/{cfg.runs} {system:<12} worker {m.rate:>8,.0f}/s ({m.n:,})")
    finally:
        vhosts.close()

    def med(system: str, phase: str) -> float | None:
        ms = runs.get((system, phase))
        return statistics.median(m.rate for m in ms) if ms else None

    rows = []
    for (system, phase), ms in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rate = statistics.median(m.rate for m in ms)
        raw = med(RAW, phase)
        rows.append(
            {
                "system": system,
                "phase": phase,
                "n": max(m.n for m in ms),
                "msgs_per_s": rate,
                "runs": [round(m.rate, 1) for m in ms],
                "vs_raw": rate / raw if raw and system != RAW else None,
            }
        )

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    targets = [
        ("end to end: fairq / raw aio-pika >= 0.5", ratio(med(FAIRQ, E2E), med(RAW, E2E)), 0.5),
        ("end to end: fairq / raw aiormq (no goal)", ratio(med(FAIRQ, E2E), med(AIORMQ, E2E)), 0.0),
        ("worker: fairq / dramatiq >= 1.5", ratio(med(FAIRQ, WORKER), med(DRAMATIQ, WORKER)), 1.5),
        ("worker: fairq / celery >= 1.0", ratio(med(FAIRQ, WORKER), med(CELERY, WORKER)), 1.0),
        ("worker: fairq / taskiq >= 1.0", ratio(med(FAIRQ, WORKER), med(TASKIQ, WORKER)), 1.0),
    ]
    return {
        "benchmark": "queues-amqp",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "seconds": round(time.time() - started, 1),
        "machine": machine(),
        "config": {
            "n": cfg.n,
            "worker_n": cfg.worker_n,
            "runs": cfg.runs,
            "batch": BATCH,
            "prefetch": PREFETCH,
            "slots": SLOTS,
        },
        "results": rows,
        "targets": [
            {"target": t, "value": v, "goal": g, "holds": None if v is None else v >= g}
            for t, v, g in targets
        ],
    }


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def report(doc: dict[str, Any]) -> str:
    lines = [
        "| system | phase | N | msgs/s | runs | vs raw aio-pika |",
        "|---|---|--:|--:|---|--:|",
    ]
    for r in doc["results"]:
        vs = "—" if r["vs_raw"] is None else f"{r['vs_raw']:.2f}"
        lines.append(
            f"| {r['system']} | {r['phase']} | {r['n']:,} | {r['msgs_per_s']:,.0f} | "
            f"{', '.join(f'{x:,.0f}' for x in r['runs'])} | {vs} |"
        )
    lines += ["", "| target | measured | holds |", "|---|--:|---|"]
    for t in doc["targets"]:
        v = "—" if t["value"] is None else f"{t['value']:.2f}"
        lines.append(f"| {t['target']} | {v} | {t['holds']} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.queues --backend amqp")
    p.add_argument("--backend", default="amqp")
    p.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672")
    p.add_argument("--n", type=int)
    p.add_argument("--worker-n", type=int)
    p.add_argument("--runs", type=int)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    a.n = a.n or (3_000 if a.quick else 20_000)
    a.worker_n = a.worker_n or min(a.n, 3_000 if a.quick else 10_000)
    a.runs = a.runs or (1 if a.quick else 3)
    a.systems = tuple(s.strip() for s in a.systems.split(",") if s.strip())
    doc = run(a)
    path = a.json or RESULTS / ("amqp-quick.json" if a.quick else "amqp.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(report(doc))
    _say(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
