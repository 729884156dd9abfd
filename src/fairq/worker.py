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
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from .attention import Attention, Slice
from .broker import Broker, connect
from .errors import FairqError, InvalidOption, LeaseLost, Reject
from .idempotency import Claim, IdempotencyStore, IdempotentBy, KeyFunction
from .message import Received, check_name
from .queue import Queue

__all__ = ["Backoff", "Worker", "WorkerStats"]

log = logging.getLogger("fairq.worker")

Handler = Callable[[Received], Any]
_SLICE_BATCH = 32  # messages a slice leases at a time


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
    duplicates: int = 0  # messages acked unhandled: their idempotency key was taken
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
    idempotency: IdempotentBy | None = None
    claims: IdempotencyStore | None = None
    attention: Attention | None = None  # set for an attention domain's consumer
    slice_lease: float = 30.0
    reconcile_interval: float = 30.0


@dataclass(slots=True, eq=False)
class _SliceRun:
    consumer: _Consumer
    slice: Slice
    lease_until: float


@dataclass(frozen=True, slots=True)
class _PushSettings:
    topics: list[str] | None
    concurrency: int
    timeout: float
    retry: Backoff
    rescan: float


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
        self._tasks: list[asyncio.Task[None]] = []
        self._error: Exception | None = None
        self._push: _PushSettings | None = None
        self._domains: dict[str, _Consumer] = {}
        self._slices: dict[str, _SliceRun] = {}
        self._busy_runners: set[asyncio.Task[Any]] = set()
        self._http: Any = None  # httpx.AsyncClient of push deliveries
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
        idempotency: KeyFunction | IdempotentBy | None = None,
    ) -> Callable[[Handler], Handler]:
        """Register the decorated function as the handler of queue ``name``.

        At most ``concurrency`` of its messages run at once (and at most the worker's
        ``concurrency`` over all queues). ``visibility_timeout`` overrides the queue's lease
        length for this worker's receives. ``idempotency`` (a function of the message giving
        its idempotency key, or an :class:`~fairq.IdempotentBy`) makes the handler run once
        per key: a message whose key is already claimed or completed is acked unhandled
        (counted in ``stats.duplicates``); a handler that fails releases its claim so the
        retry runs.
        """
        check_name(name)
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidOption(f"concurrency must be a positive integer, got {concurrency!r}")
        if idempotency is not None and not isinstance(idempotency, IdempotentBy):
            idempotency = IdempotentBy(idempotency)

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
                idempotency=idempotency,
            )
            return handler

        return register

    def attention(
        self,
        domain: str,
        concurrency: int | None = None,
        retry: Backoff | None = None,
        visibility_timeout: float | None = None,
        reconcile_interval: float = 30.0,
    ) -> Callable[[Handler], Handler]:
        """Register the decorated function as the handler of attention domain ``domain``.

        The worker takes the domain's signals with up to ``concurrency`` slices at once
        (default: the worker's concurrency), each a run of at most the key's plan's
        ``max_messages`` handled one after another within ``max_time``; ``msg.key`` names the
        key. Every ``reconcile_interval`` seconds it signals keys that have work but lost
        their signal.
        """
        check_name(domain, "attention domain")
        slots = self.concurrency if concurrency is None else concurrency
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise InvalidOption(f"concurrency must be a positive integer, got {concurrency!r}")
        if (
            isinstance(reconcile_interval, bool)
            or not isinstance(reconcile_interval, int | float)
            or (reconcile_interval <= 0)
        ):
            raise InvalidOption(f"reconcile_interval must be > 0, got {reconcile_interval!r}")

        def register(handler: Handler) -> Handler:
            if domain in self._domains:
                raise InvalidOption(f"attention domain {domain!r} already has a handler")
            self._domains[domain] = _Consumer(
                domain,
                handler,
                slots,
                retry or Backoff(),
                visibility_timeout,
                inspect.iscoroutinefunction(handler),
                reconcile_interval=float(reconcile_interval),
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

    def push(
        self,
        topics: list[str] | None = None,
        concurrency: int = 8,
        timeout: float = 10.0,
        retry: Backoff | None = None,
        rescan: float = 10.0,
    ) -> None:
        """Also deliver the push subscriptions of ``topics`` (None: of every topic) by HTTP
        POST (see :mod:`fairq.push`): 2xx acks; anything else or a timeout retries with
        backoff, then dead-letters. Push subscriptions made later are picked up within
        ``rescan`` seconds. Needs httpx (``pip install 'fairq[push]'``)."""
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidOption(f"concurrency must be a positive integer, got {concurrency!r}")
        self._push = _PushSettings(topics, concurrency, timeout, retry or Backoff(), rescan)

    async def run(self) -> None:
        """Consume until :meth:`stop`, SIGINT/SIGTERM, or cancellation; then shut down."""
        if not self._consumers and not self._domains and self._push is None:
            raise InvalidOption(
                "the worker has no handlers: decorate one with @worker.queue(...) "
                "or @worker.attention(...)"
            )
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._changed = asyncio.Condition()
        self._error = None
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.concurrency, thread_name_prefix="fairq-handler"
        )
        owns_broker = self._broker is None
        if self._broker is None:
            self._broker = await connect(self._url)
        signals = self._install_signals()
        self._tasks = []
        try:
            for c in list(self._consumers.values()):
                await self._attach(c)  # QueueNotFound now rather than later
            for c in list(self._consumers.values()):
                self._start(c)
            for c in self._domains.values():
                await self._attach_domain(c)
            for c in self._domains.values():
                handoff: asyncio.Queue[Slice] = asyncio.Queue()
                self._spawn(self._dispatch(c, handoff), f"fairq-dispatch:{c.name}")
                for i in range(c.concurrency):
                    self._spawn(self._run_slices(c, handoff), f"fairq-slices:{c.name}:{i}")
                self._spawn(self._reconcile(c), f"fairq-reconcile:{c.name}")
            self._spawn(self._keep_leases(), "fairq-leases")
            if self._push is not None:
                await self._scan_push()
                self._spawn(self._rescan_push(), "fairq-push-scan")
            self._started.set()
            await self._stopping.wait()
        finally:
            await self._shutdown()
            self._remove_signals(signals)
            if self._http is not None:
                await self._http.aclose()
                self._http = None
            if owns_broker:
                await self._broker.close()
                self._broker = None
            self._started.clear()
        if self._error is not None:
            raise self._error

    async def _attach(self, c: _Consumer) -> None:
        assert self._broker is not None
        c.queue = self._broker.queue(c.name)
        config = await c.queue.config()
        c.lease = c.visibility_timeout or config.visibility_timeout

    async def _attach_domain(self, c: _Consumer) -> None:
        assert self._broker is not None
        c.attention = self._broker.attention(c.name)
        config = await c.attention.config()  # AttentionNotFound now rather than later
        c.slice_lease = config.slice_lease
        queue_vt = config.queue_options.get("visibility_timeout", 30.0)
        c.lease = c.visibility_timeout or float(queue_vt)

    def _start(self, c: _Consumer) -> None:
        self._spawn(self._consume(c), f"fairq-consume:{c.name}")

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run a background part of the worker; if it fails, the worker stops with its error."""

        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.error("%s failed: %s", name, exc)
                if self._error is None:
                    self._error = exc
                assert self._stopping is not None
                self._stopping.set()

        self._tasks.append(asyncio.create_task(guarded(), name=name))

    async def _scan_push(self) -> None:
        """Start a consumer for every push subscription not consumed yet."""
        settings = self._push
        assert settings is not None and self._broker is not None
        from .push import push_handler

        if self._http is None:
            try:
                import httpx
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise InvalidOption("push delivery needs httpx: pip install 'fairq[push]'") from exc
            self._http = httpx.AsyncClient()
        broker = self._broker
        topics = settings.topics if settings.topics is not None else await broker.list_topics()
        for topic in topics:
            for sub in await broker.topic(topic).subscriptions():
                if sub.push is None or sub.queue in self._consumers:
                    continue
                handler = push_handler(sub, self._http, settings.timeout)
                c = _Consumer(sub.queue, handler, settings.concurrency, settings.retry, None, True)
                self._consumers[sub.queue] = c
                await self._attach(c)
                self._start(c)
                log.info("delivering push subscription %s.%s to %s", topic, sub.name, sub.push)

    async def _rescan_push(self) -> None:
        assert self._push is not None
        while True:
            await asyncio.sleep(self._push.rescan)
            try:
                await self._scan_push()
            except FairqError as exc:  # a topic deleted meanwhile: try again next time
                log.warning("push subscription scan failed: %s", exc)

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

    async def _take_slots(self, c: _Consumer, most: int | None = None) -> int:
        """Wait for at least one free slot for ``c``; take as many as are free now (at most
        ``most``)."""
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
            n = min(self._free, c.concurrency - c.busy, most or self.concurrency)
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
        """Receive into free slots; wait for messages holding no slot, so an idle queue never
        keeps slots from the worker's other queues."""
        assert c.queue is not None and self._stopping is not None
        q = c.queue
        wakeups = q._backend.wakeups
        while not self._stopping.is_set():
            token = wakeups.token(q.name)  # before the try: a send in between wakes us
            n = await self._take_slots(c)
            if n == 0:
                return
            try:
                msgs = await q.receive(max_messages=n, visibility_timeout=c.visibility_timeout)
            except BaseException:
                await self._give_slots(c, n)
                raise
            if len(msgs) < n:
                await self._give_slots(c, n - len(msgs))
            if not msgs:
                await wakeups.wait(token, self.poll_wait)
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
            if await self._invoke(c, msg):
                await self._settle(msg.ack(), msg)
        finally:
            self._running.pop(msg.receipt, None)
            await self._give_slots(c, 1)

    async def _invoke(self, c: _Consumer, msg: Received) -> bool:
        """Run ``c``'s handler on ``msg``; settle a rejection (dead letter) or a failure (nack
        with backoff) here. True when the handler succeeded: the caller acks."""
        claim: Claim | None = None
        try:
            if c.idempotency is not None:
                first, claim = await self._claim(c, msg)
                if not first:
                    return False
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
            await self._end_claim(claim, done=False)
            await self._settle(msg.dead_letter(rej.reason), msg)
            return False
        except asyncio.CancelledError:
            await asyncio.shield(self._end_claim(claim, done=False))
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
            await self._end_claim(claim, done=False)  # before the nack: the retry may run
            await self._settle(msg.nack(delay), msg)
            return False
        self.stats.acked += 1
        self.stats.per_queue[msg.queue] = self.stats.per_queue.get(msg.queue, 0) + 1
        await self._end_claim(claim, done=True)  # before the ack: a crash between the two
        return True  # leaves a duplicate, not a rerun

    # -- attention ---------------------------------------------------------------------------
    async def _dispatch(self, c: _Consumer, handoff: asyncio.Queue[Slice]) -> None:
        """Take the domain's signals for idle slice runners — one taker per domain, so a
        signal coming due wakes one call, not every runner."""
        assert c.attention is not None and self._stopping is not None
        while not self._stopping.is_set():
            if await self._take_slots(c, most=1) == 0:  # a runner is free
                return
            try:
                s = await c.attention._take(self.poll_wait)
            except BaseException:
                await self._give_slots(c, 1)
                raise
            if s is None:
                await self._give_slots(c, 1)
            else:
                handoff.put_nowait(s)  # the runner gives the slot back when the slice ends

    async def _run_slices(self, c: _Consumer, handoff: asyncio.Queue[Slice]) -> None:
        """One of ``c.concurrency`` runners: run the slices the dispatcher hands over."""
        me = asyncio.current_task()
        assert me is not None
        while True:
            s = await handoff.get()
            self._busy_runners.add(me)
            try:
                await self._run_slice(c, s)
            finally:
                self._busy_runners.discard(me)
                await self._give_slots(c, 1)

    async def _run_slice(self, c: _Consumer, s: Slice) -> None:
        """Handle up to the plan's ``max_messages`` messages of the key within ``max_time``,
        one after another (so ``max_concurrency=1`` keeps the key's order), acking each
        batch; then end the slice, which re-signals the key if it has backlog left."""
        assert c.attention is not None and self._stopping is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + s.plan.max_time
        handled = 0
        retry_at: float | None = None
        self._slices[s.token] = _SliceRun(c, s, loop.time() + c.slice_lease)
        try:
            while handled < s.plan.max_messages and not self._stopping.is_set():
                if loop.time() >= deadline:
                    break
                want = min(s.plan.max_messages - handled, _SLICE_BATCH)
                try:
                    msgs, retry_at = await c.attention._receive(s, want, c.visibility_timeout)
                except LeaseLost:
                    log.warning("slice of %s/%s lost its token; ending it", s.domain, s.key)
                    break
                if not msgs:
                    break
                self.stats.received += len(msgs)
                until = loop.time() + c.lease
                for m in msgs:
                    self._running[m.receipt] = _Running(c, m, until)
                done: list[Received] = []
                try:
                    for i, m in enumerate(msgs):
                        if loop.time() >= deadline or self._stopping.is_set():
                            await self._give_back(msgs[i:])
                            break
                        if await self._invoke(c, m):
                            done.append(m)
                        handled += 1
                finally:
                    await self._ack_all(done)
                    for m in msgs:
                        self._running.pop(m.receipt, None)
        finally:
            self._slices.pop(s.token, None)
            try:
                await asyncio.shield(c.attention._end(s, handled, retry_at))
            except Exception as exc:  # the token's lease frees it anyway
                log.warning("could not end the slice of %s/%s: %s", s.domain, s.key, exc)

    async def _ack_all(self, done: list[Received]) -> None:
        if not done:
            return
        q = done[0]._handle()
        try:
            await q.ack_batch([m.receipt for m in done])
        except LeaseLost as exc:
            self.stats.lease_lost += len(exc.lost)
            log.warning("%d lease(s) on %s were lost before the ack", len(exc.lost), q.name)

    async def _give_back(self, msgs: list[Received]) -> None:
        """Release messages a slice leased but will not start (not counted as attempts)."""
        if msgs:
            try:
                lost = await msgs[0]._handle().release_batch([m.receipt for m in msgs])
                self.stats.released += len(msgs) - len(lost)
            except Exception as exc:
                log.warning("could not give back %d message(s): %s", len(msgs), exc)

    async def _reconcile(self, c: _Consumer) -> None:
        """Signal the domain's keys that have work but no signal (lost ones), now and then."""
        assert c.attention is not None
        while True:
            await asyncio.sleep(c.reconcile_interval)
            try:
                n = await c.attention.reconcile()
            except FairqError as exc:
                log.warning("reconciling %s failed: %s", c.name, exc)
                continue
            if n:
                log.info(
                    "reconciler of %s signalled %d key(s) that had lost their signal", c.name, n
                )

    # -- idempotency -----------------------------------------------------------------------
    async def _claim(self, c: _Consumer, msg: Received) -> tuple[bool, Claim | None]:
        """Claim the message's idempotency key, kept alive while its handler runs. False
        when the key is held or completed: the message is a duplicate, acked here. A
        message whose key function gives None runs unclaimed."""
        assert c.idempotency is not None
        key = c.idempotency.key(msg)
        if key is None:
            return True, None
        if c.claims is None:
            assert self._broker is not None
            c.claims = self._broker.idempotency(
                c.idempotency.namespace or c.name, c.idempotency.ttl
            )
        # the holder is the message: its redelivery (its earlier run died) retakes the key
        claim = await c.claims.claim(key, lease=c.lease, holder=f"{msg.queue}/{msg.id}")
        if claim is None:
            self.stats.duplicates += 1
            log.info("message %s on %s repeats key %r: acked unhandled", msg.id, c.name, key)
            await self._settle(msg.ack(), msg)
            return False, None
        claim.keep_alive()
        return True, claim

    async def _end_claim(self, claim: Claim | None, *, done: bool) -> None:
        """Complete (``done``) or release a handler's claim. A failure is logged, not
        raised: an unreleased claim frees itself when its lease runs out."""
        if claim is None:
            return
        try:
            if done:
                await claim.complete()
            else:
                await claim.release()
        except Exception as exc:
            verb = "complete" if done else "release"
            log.warning("could not %s the claim of key %r: %s", verb, claim.key, exc)

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
        """Extend the leases of running handlers (one call per queue) and the tokens of
        running slices before they run out."""
        loop = asyncio.get_running_loop()
        while True:
            leases = [c.lease for c in (*self._consumers.values(), *self._domains.values())]
            leases += [c.slice_lease for c in self._domains.values()]
            await asyncio.sleep(max(0.05, min(min(leases, default=30.0) / 4, 5.0)))
            now = loop.time()
            due: dict[str, list[_Running]] = {}
            for run in list(self._running.values()):
                if run.lease_until - now < run.consumer.lease / 2:
                    due.setdefault(run.msg.queue, []).append(run)
            for name, runs in due.items():
                lease = runs[0].consumer.lease
                try:
                    q = runs[0].msg._handle()
                    lost = set(await q.extend_batch([r.msg.receipt for r in runs], lease))
                except Exception:
                    log.warning("could not extend leases on %s", name, exc_info=True)
                    continue
                until = loop.time() + lease
                for r in runs:
                    if r.msg.receipt in lost:
                        log.warning(
                            "lease of message %s on %s is lost while it runs", r.msg.id, name
                        )
                    r.lease_until = until
            for sr in list(self._slices.values()):
                if sr.lease_until - now < sr.consumer.slice_lease / 2:
                    assert sr.consumer.attention is not None
                    try:
                        kept = await sr.consumer.attention._extend(sr.slice)
                    except Exception:
                        log.warning("could not extend a slice token", exc_info=True)
                        continue
                    if not kept:
                        log.warning("slice of %s/%s lost its token", sr.slice.domain, sr.slice.key)
                    sr.lease_until = loop.time() + sr.consumer.slice_lease

    async def _shutdown(self) -> None:
        assert self._stopping is not None
        self._stopping.set()
        await self._notify()
        tasks = self._tasks
        busy = set(self._busy_runners)  # slices in progress stop after their current message
        receivers = [
            t for t in tasks if not t.get_name().startswith("fairq-leases") and t not in busy
        ]
        for t in receivers:
            t.cancel()  # stop receiving; the lease keeper runs on while handlers finish
        await asyncio.gather(*receivers, return_exceptions=True)
        handlers: list[asyncio.Task[Any]] = [
            r.task for r in self._running.values() if r.task is not None
        ]
        handlers += busy
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
        by_queue: dict[str, list[Received]] = {}
        for run in self._running.values():
            by_queue.setdefault(run.msg.queue, []).append(run.msg)
        for name, msgs in by_queue.items():
            await self._give_back(msgs)
            log.info("gave %d unfinished message(s) back to %s", len(msgs), name)
