"""Attention queues: fair, on-demand consumption of very many small per-key queues.

Each key (a store, an account, a tenant's integration) has its own work queue, named
from a template (``process.{domain}.{key}.work``). Publishing to a key stores the work
message and, in the same atomic step, makes sure a small *signal* for the key is pending
in the domain's attention queue (``attention.{domain}.work``). Workers take signals, not
messages: a signal gives the worker a *slice* of the key's work queue — at most
``max_messages`` messages or ``max_time`` seconds, under a concurrency token of the key —
after which the key, if it still has backlog, is signalled again at the tail. Like a CPU
scheduler's time slices, no key monopolises the workers, and no worker polls an empty
queue.

Fairness is two-level and counted in worker time: tenants share the workers (each is
charged the time its slices hold a worker, over its plans' ``weight``; the one that has
used least goes next), then the tenant's keys take turns; a key's share is set by its
:class:`Plan`, never by its backlog. The seed is the article "Attention Queue: on-demand
processing for granular queues" (MarketHub, 50,000 stores).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from .clock import ManualClock
from .errors import InvalidOption
from .message import Outgoing, Received, check_key, check_name
from .model.attention import (
    RESOURCE_STATES,
    AttentionConfig,
    AttentionStats,
    KeyStats,
    Plan,
    ResourceState,
    SignalHint,
    Slice,
    TenantStats,
)
from .queue import Queue, make_envelopes, wait_for_room

if TYPE_CHECKING:
    from .backends.base import Backend

__all__ = [
    "RESOURCE_STATES",
    "Attention",
    "AttentionConfig",
    "AttentionStats",
    "KeyStats",
    "Plan",
    "ResourceState",
    "Slice",
    "TenantStats",
]

#: seconds a broker waits past a delayed signal's due time before it takes a signal another
#: broker (another process) scheduled: that one takes it on time, so one due signal costs
#: one take attempt rather than one per process; if it cannot (busy, gone), this one does
FOREIGN_DUE_GRACE = 0.05
#: a taker sleeping until a signal of its own comes due wakes this much early and yields to
#: the loop until the clock gets there: the loop's timers run up to a millisecond late, and
#: a rate-limited key with burst 1 loses that much of every period to its bucket's cap
_ON_TIME = 0.0015


class Attention:
    """A handle to one attention domain; ``broker.attention(domain)`` makes one."""

    __slots__ = ("_backend", "_max_bytes", "name")

    def __init__(self, backend: Backend, name: str, max_message_bytes: int) -> None:
        self.name = check_name(name, "attention domain")
        self._backend = backend
        self._max_bytes = max_message_bytes

    def __repr__(self) -> str:
        return f"Attention({self.name!r})"

    @property
    def queue_name(self) -> str:
        """The name of the domain's attention queue."""
        return f"attention.{self.name}.work"

    async def config(self) -> AttentionConfig:
        """The options the domain is declared with."""
        return await self._backend.attention_config(self.name)

    async def queue(self, key: str) -> Queue:
        """The work queue handle of ``key`` (for stats, peeking, redrive)."""
        config = await self.config()
        return Queue(self._backend, config.queue_for(self.name, check_key(key)), self._max_bytes)

    async def publish(
        self,
        key: str,
        body: object,
        attributes: Mapping[str, str] | None = None,
        delay: float = 0.0,
        priority: int = 0,
        group: str | None = None,
        dedup_id: str | None = None,
        timeout: float | None = None,
        connection: object | None = None,
    ) -> str:
        """Store a work message for ``key`` and make sure a signal for the key is pending,
        in one atomic step; return the message id. A key seen for the first time gets the
        default plan, state ``active`` and itself as tenant. Publishing to a ``removed``
        key raises ``InvalidOption`` (``set_resource(key, state="active")`` revives it).
        ``connection`` (PostgreSQL): the work message and its signal are written inside the
        caller's transaction (the outbox), so they exist only if it commits."""
        (mid,) = await self.publish_batch(
            key,
            [Outgoing(body, attributes, delay, priority, group, dedup_id)],
            timeout=timeout,
            connection=connection,
        )
        return mid

    async def publish_batch(
        self,
        key: str,
        messages: Iterable[Outgoing],
        timeout: float | None = None,
        connection: object | None = None,
    ) -> list[str]:
        """Publish many work messages for one key in one atomic step."""
        check_key(key)
        envs = make_envelopes(messages, self._max_bytes, "publish_batch")
        if not envs:
            return []
        backend = self._backend
        if connection is not None:
            return await wait_for_room(
                backend,
                None,
                timeout,
                lambda: backend.attention_publish_in(connection, self.name, key, envs),
            )
        return await wait_for_room(
            backend, None, timeout, lambda: backend.attention_publish(self.name, key, envs)
        )

    async def set_resource(
        self,
        key: str,
        plan: str | None = None,
        state: ResourceState | None = None,
        tenant: str | None = None,
    ) -> None:
        """Set a key's plan, state and/or tenant (creating the key if new). A key made
        ``active`` again after ``paused``/``maintenance`` is signalled if it has backlog."""
        check_key(key)
        if state is not None and state not in RESOURCE_STATES:
            raise InvalidOption(f"state must be one of {', '.join(RESOURCE_STATES)}, got {state!r}")
        if tenant is not None:
            check_key(tenant, "tenant")
        if plan is not None and not isinstance(plan, str):
            raise InvalidOption(f"plan must be a plan name, got {plan!r}")
        await self._backend.attention_set_resource(self.name, key, plan, state, tenant)

    async def remove(self, key: str, purge: bool = False) -> None:
        """Mark ``key`` removed: its signals are dropped (counted) and nobody consumes its
        queue; ``purge=True`` also deletes the messages waiting in it."""
        check_key(key)
        await self._backend.attention_set_resource(self.name, key, None, "removed", None)
        if purge:
            q = await self.queue(key)
            if q.name in await self._backend.list_queues(q.name):
                await q.purge()

    async def stats(self) -> AttentionStats:
        """The domain's counters."""
        return await self._backend.attention_stats(self.name)

    async def key_stats(self, top: int = 50) -> list[KeyStats]:
        """The ``top`` keys by backlog (then in-flight), busiest first."""
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise InvalidOption(f"top must be a positive integer, got {top!r}")
        return await self._backend.attention_key_stats(self.name, top)

    async def tenant_stats(self, top: int = 50) -> list[TenantStats]:
        """The ``top`` tenants over the last minute — worker-time share, slices, messages —
        with their backlog and whether they are at their cap, by share then backlog.
        Raises ``Unsupported`` on engines that keep no per-tenant usage yet."""
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise InvalidOption(f"top must be a positive integer, got {top!r}")
        return await self._backend.attention_tenant_stats(self.name, top)

    async def reconcile(self) -> int:
        """Signal every active key that has backlog, no pending signal and no running slice
        (a lost signal); return how many. Workers run this every ``reconcile_interval``."""
        return await self._backend.attention_reconcile(self.name)

    # -- for the worker runtime ------------------------------------------------------------
    async def _take(self, wait: float) -> Slice | None:
        """Take the next signal and its slice, waiting up to ``wait`` seconds for one.

        Waiting is cheap: the taker looks (:meth:`Backend.attention_next`, a read) before it
        takes (a write), sleeps until the next signal is due, and is the only task of this
        process waiting on the domain (the others queue behind it), so a due signal costs
        one take attempt here — and none in other processes, which look again
        ``FOREIGN_DUE_GRACE`` later than its due time unless they scheduled it."""
        backend = self._backend
        if wait <= 0:
            return await backend.attention_take(self.name)
        wakeups = backend.wakeups
        name = f"attention:{self.name}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        lead = wakeups.lead(name)
        try:
            async with asyncio.timeout(wait):
                await lead.acquire()
        except TimeoutError:
            return None
        try:
            missed = 0.0  # after a take that found nothing, a growing pause (blocked keys)
            while True:
                token = wakeups.token(name)  # before looking: a change after it wakes us
                hint = await backend.attention_next(self.name)
                at = await self._try_at(hint)
                now = backend.clock.now()
                if at is not None and at <= now:
                    got = await backend.attention_take(self.name)
                    if got is not None:
                        return got
                    if hint is not None:
                        # what looked ready was blocked, empty or rate-limited (and is
                        # re-signalled by now): look again after a pause that the take's
                        # own re-signals cannot cut short
                        missed = min(0.1, max(0.001, missed * 2))
                        token = wakeups.token(name)
                        at = now + missed
                    else:  # the engine cannot tell: wait for a wake-up
                        at = None
                else:
                    missed = 0.0
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                timeout = remaining if at is None else min(remaining, max(0.0, at - now))
                await wakeups.wait(token, timeout)
        finally:
            lead.release()

    async def _try_at(self, hint: SignalHint | None) -> float | None:
        """When to try a take after looking: now for a ready signal (or an engine that
        cannot tell), a delayed signal's due time if this broker scheduled it (reached on
        time: a little early, then yielding to the loop, whose timers run late), a grace
        later for another process's; None: nothing is due, wait to be woken."""
        backend = self._backend
        clock = backend.clock
        if hint is None or hint.ready:
            return clock.now()
        if hint.due is None:
            return None
        if not backend.attention_scheduled_here(self.name, hint.due):
            return hint.due + FOREIGN_DUE_GRACE
        if isinstance(clock, ManualClock):  # moved by advance(), which wakes every waiter
            return hint.due
        early = hint.due - clock.now()
        if early > _ON_TIME:
            return hint.due - _ON_TIME  # wake early; the look after it gets here
        while clock.now() < hint.due:  # noqa: ASYNC110 - at most _ON_TIME (1.5 ms)
            await asyncio.sleep(0)
        return hint.due

    async def _receive(
        self, s: Slice, n: int, visibility_timeout: float | None
    ) -> tuple[list[Received], float | None]:
        """Lease up to ``n`` messages of the slice's queue (fewer if the key's rate allows
        fewer); when none, also say when the rate allows more (None: the queue is empty)."""
        msgs, retry_at = await self._backend.attention_receive(
            self.name, s.token, n, visibility_timeout
        )
        q = Queue(self._backend, s.queue, self._max_bytes)
        for m in msgs:
            m._queue = q
            m.key = s.key
        return msgs, retry_at

    async def _extend(self, s: Slice) -> bool:
        """Keep the slice's concurrency token; False if it was lost."""
        return await self._backend.attention_extend(self.name, s.token)

    async def _progress(self, s: Slice, acks: Sequence[Received]) -> list[str]:
        """Ack messages the slice handled and count them for its key now (a slice whose
        worker dies keeps what it counted); return the receipts whose lease was lost."""
        return await self._backend.attention_progress(
            self.name, s.token, s.key, s.queue, [m.receipt for m in acks]
        )

    async def _end(
        self,
        s: Slice,
        processed: int,
        retry_at: float | None,
        acks: Sequence[Received] = (),
    ) -> list[str]:
        """End the slice: ack ``acks`` first (its last handled messages: one step where the
        engine can), release the token; signal the key again if it has backlog left (at
        ``retry_at`` when the key's rate ran out). Returns the receipts of ``acks`` whose
        lease was lost."""
        if not acks:
            await self._backend.attention_end(self.name, s.token, processed, retry_at)
            return []
        return await self._backend.attention_finish(
            self.name, s.token, processed, retry_at, s.queue, [m.receipt for m in acks], s.key
        )
