"""Attention slices in the worker: one taker per domain hands signals' slices to runners,
which handle a key's messages one after another within its plan, then end the slice.

A slice acks each message as it finishes — in the background, coalesced: one ack call in
flight per slice, and what finishes meanwhile rides in the next one — and ends only once
its acks have landed. It leases about ``_PREFETCH`` seconds of work at a time (from the
handler's measured duration, 1 to ``_SLICE_BATCH`` messages), the next batch's receive
started as a batch's handlers start when they should be done within a quarter of the
messages' lease (its round trips run while they do), and lets at most
twice that many handled messages wait for their ack (when acks are slower than handlers, it
waits for them), so a worker killed mid-slice leaves little leased: a few handled-but-unacked
and not-yet-started messages (two batches at most), about what a queue consumer of the same
concurrency leaves.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable

from ..attention import Slice
from ..errors import ConnectionError, FairqError, InvalidOption, LeaseLost
from ..message import Received, check_name
from .parts import Backoff, Handler, _Consumer, _Running, _SliceRun
from .runtime import Runtime

log = logging.getLogger("fairq.worker")

_SLICE_BATCH = 128  # the most messages a slice leases at a time
_PREFETCH = 0.002  # seconds of handling a slice leases ahead (at least one message)
_HANDLE_EWMA = 0.2  # how fast the measured handler duration follows new ones
#: seconds of handlers that never wait after which a slice lets its next receive go on
_YIELD_EVERY = 0.0005


class _Acks:
    """One slice's acks: sent as messages finish, one call in flight at a time."""

    __slots__ = ("_consumer", "_flying", "_pending", "_runtime", "_slice", "_task")

    def __init__(self, runtime: SliceRuntime, c: _Consumer, s: Slice) -> None:
        self._runtime = runtime
        self._consumer = c
        self._slice = s
        self._pending: list[Received] = []
        self._flying = 0  # messages of the call on its way
        self._task: asyncio.Task[None] | None = None

    @property
    def unacked(self) -> int:
        """Handled messages whose ack has not been answered yet."""
        return len(self._pending) + self._flying

    def add(self, msg: Received) -> None:
        self._pending.append(msg)
        if self._task is None:
            self._task = asyncio.create_task(self._send(), name="fairq-slice-acks")

    def add_all(self, msgs: list[Received]) -> None:
        for msg in msgs:
            self.add(msg)

    async def _send(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                self._flying = len(batch)
                await self._runtime._ack_slice(self._consumer, self._slice, batch)
                self._flying = 0
        finally:
            self._flying = 0
            self._task = None

    async def drain(self) -> None:
        """Wait until every ack added so far has been answered."""
        while self._task is not None:
            await asyncio.shield(self._task)

    def take_unsent(self) -> list[Received]:
        """The acks not on their way yet (the slice's end carries them instead)."""
        unsent, self._pending = self._pending, []
        return unsent


class SliceRuntime(Runtime):
    """The runtime with attention domains (``@worker.attention``)."""

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

    # -- hooks -----------------------------------------------------------------------------
    def _has_handlers(self) -> bool:
        return super()._has_handlers() or bool(self._domains)

    async def _start_more(self) -> None:
        await super()._start_more()
        for c in self._domains.values():
            await self._attach_domain(c)  # AttentionNotFound now rather than later
        for c in self._domains.values():
            handoff: asyncio.Queue[Slice] = asyncio.Queue()
            self._spawn(self._dispatch(c, handoff), f"fairq-dispatch:{c.name}")
            for i in range(c.concurrency):
                self._spawn(self._run_slices(c, handoff), f"fairq-slices:{c.name}:{i}")
            self._spawn(self._reconcile(c), f"fairq-reconcile:{c.name}")

    def _lease_lengths(self) -> list[float]:
        domains = self._domains.values()
        return [
            *super()._lease_lengths(),
            *(c.lease for c in domains),
            *(c.slice_lease for c in domains),
        ]

    async def _keep_more(self, now: float) -> None:
        """Renew the concurrency tokens of running slices before they run out."""
        await super()._keep_more(now)
        loop = asyncio.get_running_loop()
        for sr in list(self._slices.values()):
            if not sr.lost and sr.lease_until - now < sr.consumer.slice_lease / 2:
                assert sr.consumer.attention is not None
                try:
                    kept = await sr.consumer.attention._extend(sr.slice)
                except ConnectionError as exc:  # the engine is away: said once per outage
                    if not self._extend_failing:
                        self._extend_failing = True
                        log.warning("could not extend a slice token: %s", exc)
                    continue
                except Exception:
                    log.warning("could not extend a slice token", exc_info=True)
                    continue
                if self._extend_failing:
                    self._extend_failing = False
                    log.info("leases are extended again")
                if not kept:
                    sr.lost = True
                    log.warning("slice of %s/%s lost its token", sr.slice.domain, sr.slice.key)
                sr.lease_until = loop.time() + sr.consumer.slice_lease

    # -- slices ----------------------------------------------------------------------------
    async def _attach_domain(self, c: _Consumer) -> None:
        assert self._broker is not None
        c.attention = self._broker.attention(c.name)
        config = await c.attention.config()  # AttentionNotFound now rather than later
        c.slice_lease = config.slice_lease
        queue_vt = config.queue_options.get("visibility_timeout", 30.0)
        c.lease = c.visibility_timeout or float(queue_vt)

    async def _dispatch(self, c: _Consumer, handoff: asyncio.Queue[Slice]) -> None:
        """Take the domain's signals for idle slice runners — one taker per domain, so a
        signal coming due wakes one call, not every runner."""
        assert c.attention is not None and self._stopping is not None
        while not self._stopping.is_set():
            if await self._take_slots(c, most=1) == 0:  # a runner is free
                return
            try:
                s = await c.attention._take(self.poll_wait)
            except ConnectionError as exc:  # the engine is away: keep going
                await self._give_slots(c, 1)
                await self._outage(exc)
                continue
            except BaseException:
                await self._give_slots(c, 1)
                raise
            self._engine_back()
            if s is None:
                await self._give_slots(c, 1)
            else:
                handoff.put_nowait(s)  # the runner gives the slot back when the slice ends

    async def _run_slices(self, c: _Consumer, handoff: asyncio.Queue[Slice]) -> None:
        """One of ``c.concurrency`` runners: run the slices the dispatcher hands over."""
        me = asyncio.current_task()
        assert me is not None
        assert self._stopping is not None
        while True:
            s = await handoff.get()
            self._busy_runners.add(me)
            try:
                await self._run_slice(c, s)
            finally:
                self._busy_runners.discard(me)
                await self._give_slots(c, 1)
            if self._stopping.is_set():  # the shutdown waits for this task to return
                return

    async def _run_slice(self, c: _Consumer, s: Slice) -> None:
        """Handle up to the plan's ``max_messages`` messages of the key within ``max_time``,
        one after another (so ``max_concurrency=1`` keeps the key's order), acking each as
        it finishes; then, once the acks have landed, end the slice, which re-signals the
        key if it has backlog left.

        The next receive starts as a batch's handlers start (when the plan leaves room for
        it and the batch should end before ``max_time``), so its round trips run while they
        do: a slice holds at most two batches leased, the one being handled and the next."""
        assert c.attention is not None and self._stopping is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + s.plan.max_time
        handled = 0
        retry_at: float | None = None
        acks = _Acks(self, c, s)
        run_of_slice = self._slices[s.token] = _SliceRun(c, s, loop.time() + c.slice_lease)
        ahead: asyncio.Task[tuple[list[_Running], float | None]] | None = None
        try:
            while handled < s.plan.max_messages and not self._stopping.is_set():
                if loop.time() >= deadline:
                    break
                batch = self._prefetch(c)
                try:
                    if ahead is not None:
                        task, ahead = ahead, None
                        runs, retry_at = await task
                    else:
                        want = min(s.plan.max_messages - handled, batch)
                        runs, retry_at = await self._receive_runs(c, s, want)
                except LeaseLost:
                    run_of_slice.lost = True
                    log.warning("slice of %s/%s lost its token; ending it", s.domain, s.key)
                    break
                except ConnectionError as exc:  # the engine is away: the dispatcher waits
                    log.warning(  # for it; the slice ends (or its token's lease frees it)
                        "slice of %s/%s could not receive (%s); ending it", s.domain, s.key, exc
                    )
                    break
                if not runs:
                    break
                more = s.plan.max_messages - handled - len(runs)
                pause = loop.time()  # handlers that never wait give the receive a turn
                if more > 0 and self._receive_ahead(c, s, len(runs), deadline - pause):
                    ahead = asyncio.create_task(
                        self._receive_runs(c, s, min(more, batch)), name="fairq-slice-receive"
                    )
                try:
                    for i, run in enumerate(runs):
                        if loop.time() >= deadline or self._stopping.is_set():
                            await self._give_back([r.msg for r in runs[i:]])
                            break
                        started = loop.time()
                        if ahead is not None and started >= pause and not ahead.done():
                            await asyncio.sleep(0)  # the next receive's round trips go on
                            started = loop.time()  # (what ran meanwhile is not the handler's)
                            pause = started + _YIELD_EVERY
                        ok = await self._invoke(c, run.msg)
                        took = loop.time() - started
                        c.handle_time = (
                            took
                            if c.handle_time is None
                            else c.handle_time + _HANDLE_EWMA * (took - c.handle_time)
                        )
                        handled += 1
                        if ok:
                            run.settled = True  # the lease keeper leaves it alone from now on
                            acks.add(run.msg)
                        self._running.pop(run.msg.receipt, None)
                        if acks.unacked >= 2 * batch:  # acks slower than handlers: keep
                            await acks.drain()  # what a kill -9 would leave unacked small
                finally:
                    for run in runs:
                        self._running.pop(run.msg.receipt, None)
        finally:
            self._slices.pop(s.token, None)
            last = acks.take_unsent()  # before any await: the end carries them
            if run_of_slice.lost and last:  # its end counts nothing: the acks count them
                acks.add_all(last)
                last = []
            try:
                await asyncio.shield(self._finish_slice(c, s, acks, last, handled, retry_at, ahead))
            except Exception as exc:  # the token's lease frees it anyway
                log.warning("could not end the slice of %s/%s: %s", s.domain, s.key, exc)

    async def _receive_runs(
        self, c: _Consumer, s: Slice, n: int
    ) -> tuple[list[_Running], float | None]:
        """Lease up to ``n`` of the slice's messages, kept alive (``_running``) from now."""
        assert c.attention is not None
        msgs, retry_at = await c.attention._receive(s, n, c.visibility_timeout)
        return self._track(c, msgs), retry_at

    async def _finish_slice(
        self,
        c: _Consumer,
        s: Slice,
        acks: _Acks,
        last: list[Received],
        handled: int,
        retry_at: float | None,
        ahead: asyncio.Task[tuple[list[_Running], float | None]] | None = None,
    ) -> None:
        """The slice's acks land first: its end may re-signal the key, and the next slice
        must not find the acked messages still leased. The acks on their way are waited
        for; the ``last`` ones not sent yet go with the end, in one step where the engine
        can. A receive started ahead and not handled is waited for and given back."""
        assert c.attention is not None
        if ahead is not None:
            try:
                runs, _ = await ahead
            except Exception:  # nothing leased (its leases run out if it failed midway)
                runs = []
            for run in runs:
                self._running.pop(run.msg.receipt, None)
            await self._give_back([run.msg for run in runs])
        await acks.drain()
        lost = await c.attention._end(s, handled, retry_at, last)
        if lost:
            self.stats.lease_lost += len(lost)
            log.warning("%d lease(s) on %s were lost before the ack", len(lost), s.queue)

    def _receive_ahead(self, c: _Consumer, s: Slice, n: int, left: float) -> bool:
        """Whether a slice starts its next receive while its ``n`` messages are handled:
        once the handler's speed is known, when they should be done within the slice's
        ``left`` seconds, and soon — within a quarter of the messages' lease, so that what
        is leased ahead does not wait long for its handler (the lease keeper extends it in
        time; a slow handler gains little from hiding a round trip anyway). Never for a
        rate-limited key: its bucket sets its pace, and a receive ahead would only ask for
        the next token early and come back empty."""
        if c.handle_time is None or self._stopping is None or self._stopping.is_set():
            return False
        if s.plan.rate is not None:
            return False
        expect = c.handle_time * n
        return expect < left and expect <= c.lease / 4

    def _prefetch(self, c: _Consumer) -> int:
        """How many messages a slice leases at once: ``_PREFETCH`` seconds of handling."""
        if c.handle_time is None:
            return 1
        if c.handle_time <= 0:
            return _SLICE_BATCH
        return max(1, min(_SLICE_BATCH, int(_PREFETCH / c.handle_time)))

    async def _ack_slice(self, c: _Consumer, s: Slice, done: list[Received]) -> None:
        """Ack handled messages of the slice, counted as processed for its key in the same
        step (so a worker killed mid-slice leaves them counted); a failure is logged (the
        lease runs out and the message comes back: at-least-once)."""
        assert c.attention is not None
        try:
            lost = await c.attention._progress(s, done)
        except Exception as exc:
            log.warning("could not ack %d message(s) on %s: %s", len(done), s.queue, exc)
            return
        if lost:
            self.stats.lease_lost += len(lost)
            log.warning("%d lease(s) on %s were lost before the ack", len(lost), s.queue)

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
