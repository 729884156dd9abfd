"""The worker runtime's core: queue consumers in bounded slots, handlers (ack, nack with
backoff, dead letter, idempotency claims), lease keeping and graceful shutdown.

Capabilities built on it extend :class:`Runtime` through its hooks — attention slices in
``slices.py``, push deliveries in ``pushing.py`` — and :class:`fairq.Worker` is the last of
them (``__init__.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import itertools
import logging
import random
import signal
import sys
import threading
import traceback
import types
from collections.abc import Awaitable, Callable, Coroutine
from time import monotonic
from typing import Any

from ..broker import Broker, connect
from ..errors import ConnectionError, InvalidOption, LeaseLost, Reject
from ..idempotency import Claim, IdempotentBy, KeyFunction
from ..message import Received, check_name, check_number, safe_detail
from .metrics import MetricsServer, Reading
from .parts import (
    Backoff,
    Handler,
    WorkerStats,
    _Acks,
    _Consumer,
    _PushSettings,
    _Queued,
    _Running,
    _SliceRun,
    queue_of,
)
from .runners import DONE, Driver, Runners

__all__ = ["Backoff", "Handler", "Runtime", "WorkerStats", "queue_of"]

log = logging.getLogger("fairq.worker")

#: while metrics are served, the engine is asked this often (seconds) whether it answers,
#: and given this long to (``Runtime._watch_engine``)
PING_EVERY, PING_TIMEOUT = 1.0, 1.0


def _native_coroutine_function(f: Any) -> bool:
    """Whether calling ``f`` makes a native coroutine: an ``async def`` (or a partial or
    bound method of one) — unlike what ``inspect.markcoroutinefunction`` marks."""
    while isinstance(f, functools.partial):
        f = f.func
    f = getattr(f, "__func__", f)
    code = getattr(f, "__code__", None)
    return code is not None and bool(code.co_flags & inspect.CO_COROUTINE)


class Runtime:
    """The core of :class:`fairq.Worker` (which see).

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
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidOption(f"concurrency must be a positive integer, got {concurrency!r}")
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self._check_metrics()
        # a long poll of 0 s never waits: an idle worker would spin without yielding
        poll_wait = check_number("poll_wait", poll_wait, strict=True)
        grace = check_number("grace", grace)
        self._broker = broker if isinstance(broker, Broker) else None
        self._url = broker if isinstance(broker, str) else None
        self._own_broker = broker is not None
        self.concurrency = concurrency
        self.grace = grace
        self.poll_wait = poll_wait
        self.handle_signals = handle_signals
        self.stats = WorkerStats()
        self._consumers: dict[str, _Consumer] = {}
        self._running: dict[str, _Running] = {}
        self._free = concurrency
        self._slot_waiters: list[asyncio.Future[None]] = []  # woken when slots free up
        self._acks: dict[str, _Acks] = {}
        self._ack_senders: set[asyncio.Task[None]] = set()
        self._stopping: asyncio.Event | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._rng = random.Random()
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._error: Exception | None = None
        self._outage_wait = 0.0  # seconds between tries while the engine is unreachable
        self._outage_since = 0.0  # loop time the engine was first found unreachable
        self._extend_failing = False  # lease extensions fail for want of the engine
        self._push: _PushSettings | None = None
        self._domains: dict[str, _Consumer] = {}
        self._slices: dict[str, _SliceRun] = {}
        self._busy_runners: set[asyncio.Task[Any]] = set()
        self._http: Any = None  # httpx.AsyncClient of push deliveries
        self._push_urls: dict[str, str] = {}  # push subscription queue -> the URL it posts to
        self._retired: list[_Consumer] = []  # push consumers stopped while the worker runs
        self._signal_task: asyncio.Future[None] | None = None
        self._metrics: MetricsServer | None = None
        self._ping_down_since: float | None = None  # loop time the engine stopped answering

    def _check_metrics(self) -> None:
        port = self.metrics_port
        if port is not None and (
            isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535
        ):
            raise InvalidOption(f"metrics_port must be a port number (0-65535), got {port!r}")
        if not isinstance(self.metrics_host, str) or not self.metrics_host:
            raise InvalidOption(f"metrics_host must be a host name, got {self.metrics_host!r}")

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        """``(host, port)`` of the running worker's ``/metrics`` and ``/healthz`` (the port
        chosen when ``metrics_port=0``); None when it serves none or is not running."""
        m = self._metrics
        return None if m is None else (m.host, m.port)

    def _reading(self) -> Reading:
        """The worker's state for its ``/metrics`` and ``/healthz`` (worker/metrics.py)."""
        consumers = {**self._consumers, **self._domains}
        running: dict[str, int] = dict.fromkeys(consumers, 0)
        for run in list(self._running.values()):
            if run.task is None and run.consumer.runners is not None:
                continue  # one the keeper found in a backlog: counted with the backlog
            name = run.consumer.name
            running[name] = running.get(name, 0) + 1
        for c in self._with_runners():  # received, waiting for a runner
            assert c.runners is not None
            if c.runners.backlog:
                running[c.name] = running.get(c.name, 0) + len(c.runners.backlog)
        stats = self.stats
        for name, c in consumers.items():
            stats.queues[name] = c.run
        loop = self._loop
        down = None
        since = [self._outage_since] if self._outage_wait else []
        if self._ping_down_since is not None:
            since.append(self._ping_down_since)
        if since and loop is not None:
            down = max(0.0, loop.time() - min(since))
        return Reading(
            queues=stats.queues,
            running=running,
            concurrency={name: c.concurrency for name, c in consumers.items()},
            slots=self.concurrency,
            acked=stats.acked,
            ack_failed=stats.ack_failed,
            released=stats.released,
            lease_lost=stats.lease_lost,
            backend_down=down,
            stopping=self._stopping is None or self._stopping.is_set(),
        )

    def _with_runners(self) -> list[_Consumer]:
        """The consumers whose messages run in runners (queues, push subscriptions, and
        those retired while the worker runs)."""
        return [c for c in (*self._consumers.values(), *self._retired) if c.runners is not None]

    def takes_url_from_environment(self) -> bool:
        """True when made without a broker or URL: :meth:`run` connects to ``$FAIRQ_URL``
        (what ``fairq worker --url`` sets), else the SQLite default."""
        return not self._own_broker

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
        if not self._has_handlers():
            raise InvalidOption(
                "the worker has no handlers: decorate one with @worker.queue(...) "
                "or @worker.attention(...)"
            )
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._slot_waiters = []
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
            self._check_metrics()
            if self.metrics_port is not None:
                self._metrics = MetricsServer(self._reading, self.metrics_host, self.metrics_port)
                await self._metrics.start()
                log.info(
                    "worker metrics on http://%s:%d/metrics (health: /healthz)",
                    self.metrics_host,
                    self._metrics.port,
                )
                self._spawn(self._watch_engine(), "fairq-health")
            for c in list(self._consumers.values()):
                await self._attach(c)  # QueueNotFound now rather than later
            for c in list(self._consumers.values()):
                self._start(c)
            await self._start_more()
            self._spawn(self._keep_leases(), "fairq-leases")
            self._started.set()
            log.info(
                "worker running on %s: %s, %d handlers at most at once; SIGTERM or Ctrl-C stops it",
                self._broker.url,
                ", ".join(
                    [f"queue {name}" for name in self._consumers]
                    + [f"attention {name}" for name in self._domains]
                )
                or "push subscriptions",
                self.concurrency,
            )
            await self._stopping.wait()
        finally:
            await self._shutdown()
            if self._metrics is not None:
                await self._metrics.close()
                self._metrics = None
            for c in [*self._consumers.values(), *self._retired]:
                if c.window and c.queue is not None:
                    c.queue._backend.consumer_window(c.name, -c.window)
                    c.window = 0
            self._remove_signals(signals)
            await self._close_more()
            if owns_broker:
                await self._broker.close()
                self._broker = None
            self._started.clear()
        if self._error is not None:
            raise self._error

    # -- hooks of the capabilities built on this runtime (slices.py, pushing.py) -------------
    def _has_handlers(self) -> bool:
        return bool(self._consumers)

    async def _start_more(self) -> None:
        """Start what a capability adds (after the queue consumers)."""

    async def _close_more(self) -> None:
        """Close what a capability opened (after the shutdown)."""

    def _lease_lengths(self) -> list[float]:
        return [c.lease for c in self._consumers.values()]

    async def _keep_more(self, now: float) -> None:
        """Renew what a capability leases besides messages (every lease-keeper tick)."""

    async def _attach(self, c: _Consumer) -> None:
        assert self._broker is not None
        c.queue = self._broker.queue(c.name)
        config = await c.queue.config()
        # what this worker can run of the queue at once is all a consumer may hold (an
        # engine that prefetches, RabbitMQ, would else hold messages no handler runs)
        backend = c.queue._backend
        if c.window:
            backend.consumer_window(c.name, -c.window)
        c.window = min(c.concurrency, self.concurrency)
        backend.consumer_window(c.name, c.window)
        c.lease = c.visibility_timeout or config.visibility_timeout
        c.max_attempts = config.max_attempts

    def _start(self, c: _Consumer) -> None:
        c.runners = self._runners(c)
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
        self._slots_changed()

    async def _notify(self) -> None:
        self._slots_changed()

    def _slots_changed(self) -> None:
        """Wake every task waiting in :meth:`_take_slots` to look again."""
        waiters, self._slot_waiters = self._slot_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def _take_slots(self, c: _Consumer, most: int | None = None) -> int:
        """Wait for at least one free slot for ``c``; take as many as are free now (at most
        ``most``)."""
        stopping = self._stopping
        assert stopping is not None
        while not (stopping.is_set() or (self._free > 0 and c.busy < c.concurrency)):
            if c.queue is not None and c.queue.name in self._acks:
                # the acks left for its next receive (_queue_ack) wait for no slot
                self._send_acks(c.queue.name)
            waiter = asyncio.get_running_loop().create_future()
            self._slot_waiters.append(waiter)
            c.parked = True
            try:
                await waiter
            finally:
                c.parked = False
        if stopping.is_set():
            return 0
        n = min(self._free, c.concurrency - c.busy, most or self.concurrency)
        self._free -= n
        c.busy += n
        return n

    async def _give_slots(self, c: _Consumer, n: int) -> None:
        self._free_slots(c, n)

    def _free_slots(self, c: _Consumer, n: int) -> None:
        self._free += n
        c.busy -= n
        self._slots_changed()

    async def _consume(self, c: _Consumer) -> None:
        """Receive into free slots; wait for messages holding no slot, so an idle queue never
        keeps slots from the worker's other queues."""
        assert c.queue is not None and self._stopping is not None and c.runners is not None
        q = c.queue
        runners = c.runners
        wakeups = q._backend.wakeups
        while not self._stopping.is_set() and not c.retired:
            token = wakeups.token(q.name)  # before the try: a send in between wakes us
            n = await self._take_slots(c)
            if n == 0:
                return
            acks = self._acks.pop(q.name, None) if q._backend.acks_with_receive else None
            try:
                if acks is None:
                    msgs = await q.receive(max_messages=n, visibility_timeout=c.visibility_timeout)
                else:
                    msgs = await self._ack_receive(c, acks, n)
            except ConnectionError as exc:  # the engine is away: keep going (SPEC §10 rule 2)
                await self._give_slots(c, n)
                await self._outage(exc)
                continue
            except BaseException:
                await self._give_slots(c, n)
                raise
            self._engine_back()
            if len(msgs) < n:
                await self._give_slots(c, n - len(msgs))
            if not msgs:
                await wakeups.wait(token, self.poll_wait)
                continue
            runners.add(self._queued(c, msgs))  # a runner task starts them at once (runners.py)

    async def _ack_receive(self, c: _Consumer, acks: _Acks, n: int) -> list[Received]:
        """Receive ``n`` for ``c`` with the acks of the handlers that freed its slots, in one
        step of a backend that can (``acks_with_receive``: SQLite, one transaction and one
        commit, no task and no pass of the loop for the acks). If that step fails, nothing
        of it happened: the acks go by a task of their own, and the receive is tried alone
        (its error is the consumer's, as any receive's)."""
        q = c.queue
        assert q is not None
        try:
            lost, msgs = await q._backend.ack_receive(
                q.name, [m.receipt for m in acks.entries], n, c.visibility_timeout
            )
        except Exception:
            self._ack_task(acks)
            return await q.receive(max_messages=n, visibility_timeout=c.visibility_timeout)
        if lost:
            self._lost_acks(acks.entries, set(lost))
        return q._attach(msgs)

    def _count_received(self, c: _Consumer, msgs: list[Received]) -> float:
        """Count messages just received for ``c``; the loop time their leases end."""
        self.stats.received += len(msgs)
        c.run.received += len(msgs)
        self.stats.queues[c.name] = c.run
        return asyncio.get_running_loop().time() + c.lease

    def _queued(self, c: _Consumer, msgs: list[Received]) -> list[_Queued]:
        """Count messages just received for ``c``'s runners, each with the loop time its
        lease ends. No ``_Running`` of their own yet: the lease keeper finds them in the
        runners' backlog, and a message gets one only if it is still there when the keeper
        extends its lease or once its handler waits (``_waits``) — a handler that returns
        without waiting runs to its end before the keeper can run at all."""
        until = self._count_received(c, msgs)
        return list(zip(msgs, itertools.repeat(until)))

    def _track(self, c: _Consumer, msgs: list[Received]) -> list[_Running]:
        """Count messages just received for ``c`` and keep their leases from now on (the
        lease keeper extends what is in ``_running``): a slice's messages."""
        until = self._count_received(c, msgs)
        runs = [_Running(c, m, until) for m in msgs]
        running = self._running
        for run in runs:
            running[run.msg.receipt] = run
        return runs

    async def _watch_engine(self) -> None:
        """While metrics are served, ask the engine every ``PING_EVERY`` s whether it
        answers (``Backend.ping``), so ``/healthz`` and ``backend_up`` say it within about
        two seconds — an idle worker (waiting in a long poll) or one busy in long handlers
        would learn it only at its next receive, after the engine's whole timeout."""
        assert self._broker is not None and self._stopping is not None
        backend, stopping = self._broker.backend, self._stopping
        loop = asyncio.get_running_loop()
        while not stopping.is_set():
            try:
                async with asyncio.timeout(PING_TIMEOUT):
                    await backend.ping()
            except Exception as exc:  # any answer but a good one: not healthy
                if self._ping_down_since is None:
                    self._ping_down_since = loop.time()
                    log.warning("health check: the backend does not answer (%s)", exc or "timeout")
            else:
                if self._ping_down_since is not None:
                    log.info(
                        "health check: the backend answers again (away for %.1f s)",
                        loop.time() - self._ping_down_since,
                    )
                self._ping_down_since = None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PING_EVERY):
                    await stopping.wait()

    def _engine_back(self) -> None:
        """A call to the engine worked: if it was away, say so once and reset the pause."""
        if self._outage_wait:
            self._outage_wait = 0.0
            log.info(
                "the backend answers again (away for %.1f s)",
                asyncio.get_running_loop().time() - self._outage_since,
            )

    async def _outage(self, exc: BaseException) -> None:
        """Wait a little longer each time the engine cannot be reached (up to 1 s)."""
        if not self._outage_wait:
            self._outage_since = asyncio.get_running_loop().time()
            log.warning("the backend cannot be reached (%s); retrying until it is back", exc)
        self._outage_wait = min(1.0, max(0.05, self._outage_wait * 2))
        assert self._stopping is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._outage_wait):
                await self._stopping.wait()

    def _runners(self, c: _Consumer) -> Runners[_Queued]:
        """The runners of queue consumer ``c`` (runners.py), each with a driver of its own."""
        assert self._stopping is not None
        return Runners(
            c.name,
            c.concurrency,
            functools.partial(self._handle, c),
            self._stopping,
            drive=functools.partial(self._drive, c),
            waits=functools.partial(self._waits, c),
        )

    def _waits(self, c: _Consumer, item: _Queued, task: asyncio.Task[None]) -> None:
        """A message of ``c``'s runners waits (its handler, or the settling of what it
        raised) in runner ``task``: from now on its lease is kept (``_running``) and the
        shutdown waits for ``task``."""
        msg, until = item
        run = self._running.get(msg.receipt)
        if run is None:
            self._running[msg.receipt] = _Running(c, msg, until, task)
        else:  # the keeper found it in the backlog, or what it raised is being settled
            run.task = task

    @types.coroutine
    def _drive(self, c: _Consumer, task: asyncio.Task[None]) -> Driver:
        """Runner ``task``'s driver (runners.py): run each message of ``c`` sent in to its
        end, as :meth:`_handle` does, then yield ``DONE``. The usual handler (async, no
        idempotency key, no handler times) runs right here, without a coroutine of its own
        per message; the rest go through ``_handle``."""
        running = self._running
        acks_of = self._acks
        stats = self.stats
        # (handler times are taken while metrics are served: set before any runner starts;
        # ``yield from`` takes the coroutine of an ``async def``, not any awaitable that a
        # function marked a coroutine function may return: those are awaited in _invoke)
        usual = (
            c.is_async
            and c.idempotency is None
            and self._metrics is None
            and _native_coroutine_function(c.handler)
        )
        item = yield DONE
        while True:
            if not usual:
                yield from self._handle(c, item, task)
                item = yield DONE
                continue
            # (what _handle does with _invoke, _succeeded and _queue_ack inlined)
            msg = item[0]
            handled = False
            try:
                try:
                    yield from c.handler(msg)
                except (asyncio.CancelledError, Exception) as exc:
                    yield from self._raised(c, msg, None, exc)
                else:
                    c.run.ok += 1
                    stats.acked += 1
                    try:
                        stats.per_queue[msg.queue] += 1
                    except KeyError:  # (its first)
                        stats.per_queue[msg.queue] = 1
                    handled = True
            finally:
                if running:  # (it is there only if it waited or the keeper found it)
                    run = running.pop(msg.receipt, None)
                    if run is not None:
                        run.settled = True
                if handled:
                    acks = acks_of.get(msg.queue)
                    if acks is None:
                        self._queue_ack(c, msg)
                    else:
                        acks.entries.append(msg)
                self._free += 1
                c.busy -= 1
                if self._slot_waiters:
                    self._slots_changed()
            item = yield DONE

    async def _handle(self, c: _Consumer, item: _Queued, task: asyncio.Task[None]) -> None:
        """Run one received message of ``c`` to its end in runner ``task``: handler, then ack
        (queued), nack or dead letter; its slot is free when this returns."""
        msg = item[0]
        handled = False
        try:
            handled = await self._invoke(c, msg)
        finally:
            # from here on no lease keeping: the ack is on its way (or nothing is left to do);
            # an extension already sent that finds the message acked is no lost lease
            run = self._running.pop(msg.receipt, None)
            if run is not None:
                run.settled = True
            if handled:
                self._queue_ack(c, msg)
            self._free += 1
            c.busy -= 1
            if self._slot_waiters:
                self._slots_changed()

    def _queue_ack(self, c: _Consumer, msg: Received) -> None:
        """Ack a handled message together with the others of its queue handled in this pass
        of the event loop: one ``ack_batch`` for all of them, sent in the next pass — where
        the consumer's receive into the slots just freed joins it in one transaction (the
        backend's group commit), so a drain costs one commit per batch, not two."""
        acks = self._acks.get(msg.queue)
        if acks is None:
            q = c.queue or queue_of(msg)  # an attention consumer has no queue of its own
            acks = self._acks[q.name] = _Acks(q, [])
            if not (c.parked and c.queue is q and q._backend.acks_with_receive):
                asyncio.get_running_loop().call_soon(self._send_acks, q.name)
            # (else the slot this message frees wakes its consumer, which sends them with
            # its next receive, in one step: _ack_receive; or by a task if it gets no slot)
        acks.entries.append(msg)

    def _send_acks(self, name: str) -> None:
        acks = self._acks.pop(name, None)
        if acks is not None:
            self._ack_task(acks)

    def _ack_task(self, acks: _Acks) -> None:
        """Send ``acks`` by a task of their own (awaited at shutdown: ``_settled``)."""
        task = asyncio.create_task(self._ack_batch(acks), name=f"fairq-ack:{acks.queue.name}")
        self._ack_senders.add(task)
        task.add_done_callback(self._ack_senders.discard)

    def _not_acked(self, msgs: list[Received]) -> None:
        """Handled messages whose ack did not happen: ``acked`` counted them too early."""
        stats = self.stats
        stats.ack_failed += len(msgs)
        for msg in msgs:
            stats.acked -= 1
            stats.per_queue[msg.queue] = stats.per_queue.get(msg.queue, 1) - 1

    async def _ack_batch(self, acks: _Acks) -> None:
        entries = acks.entries
        lost: set[str] = set()
        try:
            await acks.queue.ack_batch([m.receipt for m in entries])
        except LeaseLost as exc:
            lost = set(exc.lost)
        except Exception as exc:
            # the leases end by themselves and the messages come back: at-least-once holds
            level = logging.WARNING if isinstance(exc, ConnectionError) else logging.ERROR
            log.log(
                level, "could not ack %d message(s) on %s: %s", len(entries), acks.queue.name, exc
            )
            self._not_acked(entries)
        if lost:  # (the usual case, none lost: no pass over the batch)
            self._lost_acks(entries, lost)

    def _lost_acks(self, entries: list[Received], lost: set[str]) -> None:
        """Handled messages whose ack found their lease gone: counted, and said."""
        self._not_acked([m for m in entries if m.receipt in lost])
        for msg in entries:
            if msg.receipt in lost:
                self.stats.lease_lost += 1
                log.warning(
                    "lease of message %s on %s was lost before it was settled; it will be "
                    "delivered again (make the handler idempotent)",
                    msg.id,
                    msg.queue,
                )

    async def _settled(self) -> None:
        """Wait until every queued ack has been sent (at shutdown)."""
        while self._acks or self._ack_senders:
            for name in list(self._acks):
                self._send_acks(name)
            await asyncio.wait(set(self._ack_senders), timeout=max(self.grace, 1.0))
            if self._ack_senders and not self._acks:
                return  # the engine does not answer: the leases bring the messages back

    async def _invoke(self, c: _Consumer, msg: Received) -> bool:
        """Run ``c``'s handler on ``msg``; settle a rejection (dead letter) or a failure (nack
        with backoff) here. True when the handler succeeded: the caller acks."""
        claim: Claim | None = None
        # handler times only while metrics are served (two clock reads and a bucket a message)
        timed = self._metrics is not None
        try:
            if c.idempotency is not None:
                first, claim = await self._claim(c, msg)
                if not first:
                    c.run.duplicate += 1
                    return False
            started = monotonic() if timed else 0.0
            try:
                if c.is_async:
                    await c.handler(msg)
                else:
                    assert self._pool is not None
                    ctx = contextvars.copy_context()
                    await asyncio.get_running_loop().run_in_executor(
                        self._pool, functools.partial(ctx.run, c.handler, msg)
                    )
            finally:
                if timed:
                    c.run.times.observe(monotonic() - started)
        except (asyncio.CancelledError, Exception) as exc:
            await self._raised(c, msg, claim, exc)
            return False
        self._succeeded(c, msg)
        if claim is not None:  # before the ack: a crash between the two leaves a duplicate,
            await self._end_claim(claim, done=True)  # not a rerun
        return True

    def _succeeded(self, c: _Consumer, msg: Received) -> None:
        """Count a handler that returned (its message is acked)."""
        c.run.ok += 1
        stats = self.stats
        stats.acked += 1
        stats.per_queue[msg.queue] = stats.per_queue.get(msg.queue, 0) + 1

    async def _raised(
        self, c: _Consumer, msg: Received, claim: Claim | None, exc: BaseException
    ) -> None:
        """Settle what a handler raised (called inside its ``except``, for the traceback): a
        rejection is dead-lettered, a failure nacked; the worker's own cancellation of the
        handler releases the claim and goes on up."""
        counts = c.run
        if isinstance(exc, Reject):
            self.stats.rejected += 1
            counts.rejected += 1
            await self._end_claim(claim, done=False)
            await self._settle(c, msg.dead_letter(safe_detail(str(exc.reason))), msg)
            return
        if isinstance(exc, asyncio.CancelledError):
            me = asyncio.current_task()
            if me is None or me.cancelling():
                await asyncio.shield(self._end_claim(claim, done=False))
                raise exc
            # the handler's own CancelledError (a task or timeout of its own that it let
            # out), not this worker's cancellation: a failure like any other, retried now
            # rather than left to wait for the end of its lease
        counts.failed += 1
        await self._failed(c, msg, claim)

    async def _failed(self, c: _Consumer, msg: Received, claim: Claim | None) -> None:
        """Settle a handler's failure (called inside its ``except``, for the traceback):
        nack with the consumer's backoff, or dead-letter past ``max_attempts``; the nack
        carries the exception (``Type: text``), a dead letter's ``fairq.detail``."""
        self.stats.failed += 1
        delay = c.retry.delay(msg.attempt, self._rng)
        if c.max_attempts is not None and msg.attempt >= c.max_attempts:
            log.exception(
                "handler of %s failed on message %s (attempt %d, the last of "
                "max_attempts=%d); it is dead-lettered, not retried",
                c.name,
                msg.id,
                msg.attempt,
                c.max_attempts,
            )
        else:
            log.exception(
                "handler of %s failed on message %s (attempt %d); retry in %.1f s",
                c.name,
                msg.id,
                msg.attempt,
                delay,
            )
        exc = sys.exc_info()[1]
        error = None
        if exc is not None:  # (any text: NUL and lone surrogates escaped)
            error = safe_detail("".join(traceback.format_exception_only(exc)).strip())
        await self._end_claim(claim, done=False)  # before the nack: the retry may run
        await self._settle(c, msg.nack(delay, error=error), msg)

    async def _give_back(self, msgs: list[Received]) -> None:
        """Release messages a slice leased but will not start (not counted as attempts)."""
        if msgs:
            try:
                lost = await queue_of(msgs[0]).release_batch([m.receipt for m in msgs])
                self.stats.released += len(msgs) - len(lost)
            except Exception as exc:
                log.warning("could not give back %d message(s): %s", len(msgs), exc)

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
            await self._settle(c, msg.ack(), msg)
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

    async def _settle(self, c: _Consumer, step: Awaitable[None], msg: Received) -> None:
        run = self._running.get(msg.receipt)
        if run is None and c.runners is not None:
            # a runner's message that has not waited yet: it may now, and the keeper must
            # leave it alone (what ends its handling takes it out of ``_running`` again)
            run = self._running[msg.receipt] = _Running(c, msg, 0.0, asyncio.current_task())
        if run is not None:
            run.settled = True  # a lease extension racing this step is not a lost lease
        try:
            await step
        except ConnectionError as exc:
            # the lease ends by itself and the message comes back: at-least-once holds
            log.warning("could not settle message %s on %s: %s", msg.id, msg.queue, exc)
        except LeaseLost:
            self.stats.lease_lost += 1
            log.warning(
                "lease of message %s on %s was lost before it was settled; it will be "
                "delivered again (make the handler idempotent)",
                msg.id,
                msg.queue,
            )

    async def _keep_leases(self) -> None:
        """Extend the leases of received messages (running or waiting for a runner) and
        the tokens of running slices before they run out."""
        loop = asyncio.get_running_loop()
        while True:
            leases = self._lease_lengths()
            await asyncio.sleep(max(0.05, min(min(leases, default=30.0) / 4, 5.0)))
            now = loop.time()
            await self._extend_leases(now)
            await self._keep_more(now)

    async def _extend_leases(self, now: float) -> None:
        """Extend (one call per queue) the leases that end within half their length from
        ``now``: of running handlers, and of messages still waiting for a runner."""
        loop = asyncio.get_running_loop()
        due: dict[str, list[_Running]] = {}
        running = self._running
        for run in list(running.values()):
            if not run.settled and not run.lost and run.lease_until - now < run.consumer.lease / 2:
                due.setdefault(run.msg.queue, []).append(run)
        for c in self._with_runners():  # what waits in a backlog, not in _running yet
            assert c.runners is not None
            for msg, until in c.runners.backlog:
                if until - now < c.lease / 2 and msg.receipt not in running:
                    run = running[msg.receipt] = _Running(c, msg, until)
                    due.setdefault(msg.queue, []).append(run)
        for name, runs in due.items():
            lease = runs[0].consumer.lease
            try:
                q = queue_of(runs[0].msg)
                lost = set(await q.extend_batch([r.msg.receipt for r in runs], lease))
            except ConnectionError as exc:  # the engine is away: said once per outage
                if not self._extend_failing:
                    self._extend_failing = True
                    log.warning("could not extend leases on %s: %s", name, exc)
                continue
            except Exception:
                log.warning("could not extend leases on %s", name, exc_info=True)
                continue
            if self._extend_failing:
                self._extend_failing = False
                log.info("leases are extended again")
            until = loop.time() + lease
            for r in runs:
                # an ack (nack, dead letter) that landed before the extension is no loss
                if r.msg.receipt in lost and not r.settled:
                    r.lost = True
                    log.warning("lease of message %s on %s is lost while it runs", r.msg.id, name)
                r.lease_until = until

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
        await self._give_back_unstarted()
        handlers = {r.task for r in self._running.values() if r.task is not None} | busy
        if handlers:
            log.info("waiting up to %.0f s for %d running handler(s)", self.grace, len(handlers))
            _, pending = await asyncio.wait(handlers, timeout=self.grace)
            if pending:
                await self._release_running()
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        await self._settled()
        for c in [*self._consumers.values(), *self._retired]:
            if c.runners is not None:
                tasks = [*tasks, *c.runners.tasks]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def _give_back_unstarted(self) -> None:
        """Stop the runners at their current message; give back at once the received
        messages no runner started (not counted as attempts)."""
        by_queue: dict[str, list[Received]] = {}
        for c in [*self._consumers.values(), *self._retired]:
            if c.runners is None:
                continue
            c.runners.stop()
            items = c.runners.take_backlog()
            for msg, _ in items:
                self._running.pop(msg.receipt, None)
                by_queue.setdefault(msg.queue, []).append(msg)
            if items:
                self._free_slots(c, len(items))
        for msgs in by_queue.values():
            await self._give_back(msgs)

    async def _release_running(self) -> None:
        """Give every message whose handler is still running back to its queue now."""
        by_queue: dict[str, list[Received]] = {}
        for run in self._running.values():
            if not run.settled:
                by_queue.setdefault(run.msg.queue, []).append(run.msg)
        for name, msgs in by_queue.items():
            await self._give_back(msgs)
            log.info("gave %d unfinished message(s) back to %s", len(msgs), name)
