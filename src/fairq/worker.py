"""The worker runtime: run handlers over queues with bounded concurrency.

    worker = fairq.Worker("sqlite:///fairq.db", concurrency=16)

    @worker.queue("ticket-pdf", concurrency=8, retry=fairq.Backoff(base=1, cap=300))
    async def make_pdf(msg): ...

    await worker.run()          # or: fairq worker app.module:worker

* A handler that returns acks its message; one that raises nacks it with exponential
  backoff and jitter (the backend dead-letters it after ``max_attempts``); one that
  raises :class:`fairq.Reject` dead-letters it at once.
* Messages are received only into free slots (never more than the worker can start), and
  their leases are extended while their handler runs, so a slow handler keeps its message.
* Sync handlers run in a thread pool.
* ``SIGTERM``/``SIGINT`` (or :meth:`Worker.stop`): stop receiving, let running handlers
  finish within ``grace`` seconds, then give the rest back without counting the attempt.
  A ``SIGKILL`` loses nothing either: the leases simply run out and the messages return.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import logging
import random
import signal
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .broker import Broker, connect
from .errors import InvalidOption, LeaseLost, Reject
from .message import Received, check_name
from .queue import Queue

__all__ = ["Backoff", "Worker", "WorkerStats"]

log = logging.getLogger("fairq.worker")

Handler = Callable[[Received], Any]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Retry delays: ``base * 2**(attempt-1)`` seconds, at most ``cap``, with the top
    ``jitter`` fraction randomised so failed messages do not come back in lockstep."""

    base: float = 1.0
    cap: float = 300.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0 or not 0 <= self.jitter <= 1:
            raise InvalidOption("Backoff needs base >= 0, cap >= 0 and 0 <= jitter <= 1")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before delivery ``attempt + 1``."""
        exp = min(max(attempt, 1) - 1, 64)
        d = min(self.cap, self.base * (2.0**exp))
        return d * (1.0 - self.jitter * (rng or random).random())


@dataclass(slots=True)
class WorkerStats:
    """What a worker has done since it started."""

    received: int = 0
    acked: int = 0
    failed: int = 0
    rejected: int = 0
    released: int = 0
    lease_lost: int = 0
    per_queue: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Consumer:
    name: str
    handler: Handler
    concurrency: int
    retry: Backoff
    visibility_timeout: float | None
    is_async: bool
    queue: Queue | None = None
    lease: float = 30.0
    busy: int = 0


@dataclass(slots=True, eq=False)
class _Running:
    consumer: _Consumer
    msg: Received
    lease_until: float
    task: asyncio.Task[None] | None = None


class Worker:
    """Runs handlers over queues; see the module docstring.

    ``broker`` is a connected :class:`~fairq.Broker`, or a URL (None: ``$FAIRQ_URL``,
    else the SQLite default) that :meth:`run` connects to — so a worker can be defined at
    import time and started with ``fairq worker module:attr``.
    """

    def __init__(
        self,
        broker: Broker | str | None = None,
        concurrency: int = 16,
        *,
        grace: float = 30.0,
        poll_wait: float = 5.0,
        handle_signals: bool = True,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidOption(f"concurrency must be a positive integer, got {concurrency!r}")
        self._broker = broker if isinstance(broker, Broker) else None
        self._url = broker if isinstance(broker, str) else None
        self.concurrency = concurrency
        self.grace = grace
        self.poll_wait = poll_wait
        self.handle_signals = handle_signals
        self.stats = WorkerStats()
        self._consumers: dict[str, _Consumer] = {}
        self._running: dict[str, _Running] = {}
        self._free = concurrency
        self._changed: asyncio.Condition | None = None
        self._stopping: asyncio.Event | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._rng = random.Random()
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signal_task: asyncio.Future[None] | None = None

    @property
    def broker(self) -> Broker | None:
        return self._broker

    # -- registration ----------------------------------------------------------------------
    def queue(
        self,
        name: str,
        concurrency: int = 8,
        retry: Backoff | None = None,
        visibility_timeout: float | None = None,
    ) -> Callable[[Handler], Handler]:
        """Register the decorated function as the handler of queue ``name``.

        At most ``concurrency`` of its messages run at once (and at most the worker's
        ``concurrency`` over all queues). ``visibility_timeout`` overrides the queue's lease
        length for this worker's receives.
        """
        check_name(name)
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidOption(f"concurrency must be a positive integer, got {concurrency!r}")

        def register(handler: Handler) -> Handler:
            if name in self._consumers:
                raise InvalidOption(f"queue {name!r} already has a handler in this worker")
            self._consumers[name] = _Consumer(
                name,
                handler,
                concurrency,
                retry or Backoff(),
                visibility_timeout,
                inspect.iscoroutinefunction(handler),
            )
            return handler

        return register

    # -- running ---------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask a running worker to shut down gracefully (thread-safe)."""
        stopping = self._stopping
        if stopping is None:
            return
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)

    async def run(self) -> None:
        """Consume until :meth:`stop`, SIGINT/SIGTERM, or cancellation; then shut down."""
        if not self._consumers:
            raise InvalidOption("the worker has no handlers: decorate one with @worker.queue(...)")
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._changed = asyncio.Condition()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.concurrency, thread_name_prefix="fairq-handler"
        )
        owns_broker = self._broker is None
        if self._broker is None:
            self._broker = await connect(self._url)
        broker = self._broker
        signals = self._install_signals()
        tasks: list[asyncio.Task[None]] = []
        try:
            for c in self._consumers.values():
                c.queue = broker.queue(c.name)
                config = await c.queue.config()  # QueueNotFound now rather than later
                c.lease = c.visibility_timeout or config.visibility_timeout
            tasks = [
                asyncio.create_task(self._consume(c), name=f"fairq-consume:{c.name}")
                for c in self._consumers.values()
            ]
            tasks.append(asyncio.create_task(self._keep_leases(), name="fairq-leases"))
            self._started.set()
            stop_wait = asyncio.create_task(self._stopping.wait())
            done, _ = await asyncio.wait([stop_wait, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stop_wait and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
            stop_wait.cancel()
        finally:
            await self._shutdown(tasks)
            self._remove_signals(signals)
            if owns_broker:
                await broker.close()
                self._broker = None
            self._started.clear()

    def _install_signals(self) -> list[signal.Signals]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return []
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
                installed.append(sig)
            except (NotImplementedError, RuntimeError):  # pragma: no cover - not on Unix
                pass
        return installed

    def _remove_signals(self, signals: list[signal.Signals]) -> None:
        loop = asyncio.get_running_loop()
        for sig in signals:
            loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        assert self._stopping is not None
        if self._stopping.is_set():
            log.warning("second %s: giving in-flight messages back now", sig.name)
            self.grace = 0.0
        else:
            log.info("%s: finishing in-flight messages (grace %.0f s)", sig.name, self.grace)
        self._stopping.set()
        if self._changed is not None:
            self._signal_task = asyncio.ensure_future(self._notify())

    async def _notify(self) -> None:
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    async def _take_slots(self, c: _Consumer) -> int:
        """Wait for at least one free slot for ``c``; take as many as are free now."""
        assert self._changed is not None and self._stopping is not None
        async with self._changed:
            await self._changed.wait_for(
                lambda: (
                    self._stopping.is_set()  # type: ignore[union-attr]
                    or (self._free > 0 and c.busy < c.concurrency)
                )
            )
            if self._stopping.is_set():
                return 0
            n = min(self._free, c.concurrency - c.busy)
            self._free -= n
            c.busy += n
            return n

    async def _give_slots(self, c: _Consumer, n: int) -> None:
        assert self._changed is not None
        async with self._changed:
            self._free += n
            c.busy -= n
            self._changed.notify_all()

    async def _consume(self, c: _Consumer) -> None:
        assert c.queue is not None and self._stopping is not None
        q = c.queue
        while not self._stopping.is_set():
            n = await self._take_slots(c)
            if n == 0:
                return
            try:
                msgs = await q.receive(
                    max_messages=n, visibility_timeout=c.visibility_timeout, wait=self.poll_wait
                )
            except BaseException:
                await self._give_slots(c, n)
                raise
            if len(msgs) < n:
                await self._give_slots(c, n - len(msgs))
            if not msgs:
                continue
            self.stats.received += len(msgs)
            loop = asyncio.get_running_loop()
            until = loop.time() + c.lease
            for m in msgs:
                run = _Running(c, m, until)
                self._running[m.receipt] = run
                run.task = asyncio.create_task(self._handle(run), name=f"fairq-handle:{m.id}")

    async def _handle(self, run: _Running) -> None:
        c, msg = run.consumer, run.msg
        try:
            try:
                if c.is_async:
                    await c.handler(msg)
                else:
                    assert self._pool is not None
                    ctx = contextvars.copy_context()
                    await asyncio.get_running_loop().run_in_executor(
                        self._pool, functools.partial(ctx.run, c.handler, msg)
                    )
            except Reject as rej:
                self.stats.rejected += 1
                await self._settle(msg.dead_letter(rej.reason), msg)
            except asyncio.CancelledError:
                raise
            except Exception:
                self.stats.failed += 1
                delay = c.retry.delay(msg.attempt, self._rng)
                log.exception(
                    "handler of %s failed on message %s (attempt %d); retry in %.1f s",
                    c.name,
                    msg.id,
                    msg.attempt,
                    delay,
                )
                await self._settle(msg.nack(delay), msg)
            else:
                self.stats.acked += 1
                self.stats.per_queue[c.name] = self.stats.per_queue.get(c.name, 0) + 1
                await self._settle(msg.ack(), msg)
        finally:
            self._running.pop(msg.receipt, None)
            await self._give_slots(c, 1)

    async def _settle(self, step: Awaitable[None], msg: Received) -> None:
        try:
            await step
        except LeaseLost:
            self.stats.lease_lost += 1
            log.warning(
                "lease of message %s on %s was lost before it was settled; it will be "
                "delivered again (make the handler idempotent)",
                msg.id,
                msg.queue,
            )

    async def _keep_leases(self) -> None:
        """Extend the leases of running handlers before they run out, one call per queue."""
        loop = asyncio.get_running_loop()
        while True:
            shortest = min((c.lease for c in self._consumers.values()), default=30.0)
            await asyncio.sleep(max(0.05, min(shortest / 4, 5.0)))
            now = loop.time()
            due: dict[str, list[_Running]] = {}
            for run in list(self._running.values()):
                if run.lease_until - now < run.consumer.lease / 2:
                    due.setdefault(run.consumer.name, []).append(run)
            for name, runs in due.items():
                c = self._consumers[name]
                assert c.queue is not None
                try:
                    lost = set(await c.queue.extend_batch([r.msg.receipt for r in runs], c.lease))
                except Exception:
                    log.warning("could not extend leases on %s", name, exc_info=True)
                    continue
                until = loop.time() + c.lease
                for r in runs:
                    if r.msg.receipt in lost:
                        log.warning(
                            "lease of message %s on %s is lost while it runs", r.msg.id, name
                        )
                    r.lease_until = until

    async def _shutdown(self, tasks: list[asyncio.Task[None]]) -> None:
        assert self._stopping is not None
        self._stopping.set()
        await self._notify()
        for t in tasks:
            if not t.get_name().startswith("fairq-leases"):
                t.cancel()
        await asyncio.gather(
            *[t for t in tasks if not t.get_name().startswith("fairq-leases")],
            return_exceptions=True,
        )
        handlers = [r.task for r in self._running.values() if r.task is not None]
        if handlers:
            log.info("waiting up to %.0f s for %d running handler(s)", self.grace, len(handlers))
            _, pending = await asyncio.wait(handlers, timeout=self.grace)
            if pending:
                await self._release_running()
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def _release_running(self) -> None:
        """Give every message whose handler is still running back to its queue now."""
        by_queue: dict[str, list[_Running]] = {}
        for run in self._running.values():
            by_queue.setdefault(run.consumer.name, []).append(run)
        for name, runs in by_queue.items():
            c = self._consumers[name]
            assert c.queue is not None
            try:
                lost = await c.queue.release_batch([r.msg.receipt for r in runs])
                self.stats.released += len(runs) - len(lost)
            except Exception:
                log.warning(
                    "could not release messages on %s; their leases will expire",
                    name,
                    exc_info=True,
                )
            log.info("gave %d unfinished message(s) back to %s", len(runs), name)
