"""THE backend seam: what a storage engine must do for fairq, in domain terms.

Every method is one atomic step at the engine — one SQL transaction, one Lua script —
so no invariant ever depends on luck between two calls. Handles (``fairq.queue`` ...)
validate and encode; a backend stores, leases and moves messages and keeps the counters.

A backend also owns :class:`Wakeups`: long polls and blocked sends wait on a per-queue
wake-up token that the backend fires when something may have changed — a send or ack in
this process, a commit by another process, or a delayed message or lease coming due.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import ClassVar

from ..clock import Clock, ManualClock
from ..errors import QueueNotFound, Unsupported
from ..message import Received
from ..model.attention import (
    AttentionConfig,
    AttentionStats,
    KeyStats,
    SignalHint,
    Slice,
    TenantStats,
)
from ..model.idempotency import IdempotencyRecord, Version
from ..model.queues import Envelope, QueueConfig, QueueStats
from ..model.rooms import Place, RoomRecord, RoomStats, TickResult
from ..model.topics import PublishResult, Subscription, TopicConfig, TopicStats

__all__ = ["DEAD_LETTER_REASONS", "STOP_WAITING", "Backend", "WaitInterrupted", "Wakeups"]

log = logging.getLogger("fairq.backends")

#: the reasons a message can be dead-lettered for (attribute ``fairq.reason``)
DEAD_LETTER_REASONS = ("max_attempts", "expired", "rejected", "overflow")


#: an event that, once set, ends every :meth:`Wakeups.wait` of the tasks that see it
#: (raising :class:`WaitInterrupted`): a server that stops ends its long polls and blocked
#: sends where they wait, while an engine call already on its way runs to its answer
STOP_WAITING: contextvars.ContextVar[asyncio.Event | None] = contextvars.ContextVar(
    "fairq_stop_waiting", default=None
)


class WaitInterrupted(Exception):
    """A wait ended because :data:`STOP_WAITING` was set (nothing was done by the wait)."""


class Wakeups:
    """Per-queue wake-up tokens for long polls and blocked sends.

    A waiter takes ``token(queue)`` *before* it tries, then ``await wait(token, timeout)``
    if the try came back empty: a change between the try and the wait has already set
    the token, so no wake-up is ever missed. A background pulse, running only while
    someone waits, fires tokens for changes the process cannot see directly (another
    process's commit, a delay or lease coming due).
    """

    def __init__(self, backend: Backend, clock: Clock) -> None:
        self._backend = backend
        self._events: dict[str, asyncio.Event] = {}
        self._leads: dict[str, asyncio.Lock] = {}
        self._waiters = 0
        self._pulse: asyncio.Task[None] | None = None
        self._kick: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        if isinstance(clock, ManualClock):
            clock.on_advance(self._on_clock_advance)

    def token(self, queue: str) -> asyncio.Event:
        event = self._events.get(queue)
        if event is None:
            event = self._events[queue] = asyncio.Event()
        return event

    def lead(self, name: str) -> asyncio.Lock:
        """The lock a waiter of ``name`` holds while it tries and waits: of the tasks of this
        process waiting for ``name`` (an attention domain's signals) one at a time is
        woken — the others queue behind it — so one wake-up makes one attempt."""
        lock = self._leads.get(name)
        if lock is None:
            lock = self._leads[name] = asyncio.Lock()
        return lock

    def watched(self) -> list[str]:
        """The queues (and other wake-up names) someone holds a token for now."""
        return list(self._events)

    def notify(self, queues: Iterable[str]) -> None:
        """Wake whoever waits on these queues."""
        events = self._events
        for q in queues:
            event = events.pop(q, None)
            if event is not None:
                event.set()

    def notify_all(self) -> None:
        events = self._events
        self._events = {}
        for event in events.values():
            event.set()

    def _on_clock_advance(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self.notify_all)

    async def wait(self, token: asyncio.Event, timeout: float | None) -> None:
        """Wait until ``token`` fires or ``timeout`` seconds pass (None: no limit);
        :class:`WaitInterrupted` once :data:`STOP_WAITING`'s event is set."""
        if token.is_set():
            return
        stop = STOP_WAITING.get()
        if stop is not None:
            if stop.is_set():
                raise WaitInterrupted
            await self._wait_or_stop(token, stop, timeout)
            if stop.is_set() and not token.is_set():
                raise WaitInterrupted
            return
        await self._wait(token, timeout)

    async def _wait(self, token: asyncio.Event, timeout: float | None) -> None:
        self._loop = asyncio.get_running_loop()
        self._waiters += 1
        try:
            if self._pulse is None or self._pulse.done():
                self._pulse = asyncio.create_task(  # not the waiter's context (STOP_WAITING)
                    self._run_pulse(), name="fairq-wakeups", context=contextvars.Context()
                )
            elif self._kick is not None:
                self._kick.set()  # a new waiter may need an earlier due time
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await token.wait()
        finally:
            self._waiters -= 1

    async def _wait_or_stop(
        self, token: asyncio.Event, stop: asyncio.Event, timeout: float | None
    ) -> None:
        stopped = asyncio.ensure_future(stop.wait())
        try:
            waiting = asyncio.ensure_future(self._wait(token, timeout))
            try:
                await asyncio.wait({waiting, stopped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not waiting.done():
                    waiting.cancel()
                    await asyncio.gather(waiting, return_exceptions=True)
        finally:
            stopped.cancel()

    def poke(self) -> None:
        """Make the pulse look now (the backend saw a sign of a change, e.g. an OS file
        notification)."""
        if self._kick is not None:
            self._kick.set()

    async def _run_pulse(self) -> None:
        backend = self._backend
        clock = backend.clock
        self._kick = asyncio.Event()
        # with OS change notifications the pulse is poked when something changes, and
        # polls only as a safety net; without them it polls every poll_interval
        watching = backend.watch(self.poke)
        try:
            while self._waiters > 0:
                try:
                    due = await backend.next_due()
                except Exception:  # the pulse must survive a transient backend error
                    log.warning("wake-up pulse could not read the next due time", exc_info=True)
                    due = None
                sleep = backend.watch_interval if watching else backend.poll_interval
                if due is not None:
                    sleep = min(sleep, max(0.0, due - clock.now()))
                self._kick.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(sleep):
                        await self._kick.wait()
                if (due is not None and clock.now() >= due) or await backend.changed_elsewhere():
                    self.notify_all()
                watching = watching and backend.watching()
        finally:
            self._kick = None
            if watching:
                backend.unwatch()

    def close(self) -> None:
        if self._pulse is not None:
            self._pulse.cancel()
        self.notify_all()


class Backend(ABC):
    """A storage engine for fairq. One instance per connected broker.

    Conventions every method keeps:

    * one atomic step at the engine; on error nothing is changed;
    * queue names are already validated; a missing queue raises ``QueueNotFound``;
    * ``now`` comes from ``self.clock``; messages become visible exactly when the clock
      passes their availability time, whether or not anyone polls.
    """

    #: seconds between checks for changes made by other processes while someone waits
    poll_interval: float = 0.5
    #: the same while OS change notifications (:meth:`watch`) are on: only a safety net
    watch_interval: float = 1.0

    #: THE capability table of this backend: every rule of SPEC.md it cannot honour exactly,
    #: as capability name -> what it does instead. What is listed here raises
    #: ``fairq.Unsupported`` or is documented in docs/backends.md; the conformance suite
    #: skips the tests that ``requires()`` a listed capability, and nothing else.
    missing: ClassVar[Mapping[str, str]] = {}

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.wakeups = Wakeups(self, clock)

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:  # noqa: B027 - optional hook, nothing to do by default
        """Connect and prepare the schema; raise ``fairq.ConnectionError`` if impossible."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections and background work."""

    # -- queues ----------------------------------------------------------------------------
    @abstractmethod
    async def declare_queue(self, name: str, config: QueueConfig) -> None:
        """Create the queue or update its options (``ConfigConflict`` for fifo/max_priority
        changes); also create its dead-letter queue if it does not exist yet."""

    @abstractmethod
    async def queue_config(self, name: str) -> QueueConfig:
        """The options of an existing queue."""

    @abstractmethod
    async def delete_queue(self, name: str) -> bool:
        """Delete the queue and its messages; False if it did not exist."""

    @abstractmethod
    async def list_queues(self, prefix: str = "") -> list[str]:
        """Names of the queues starting with ``prefix``, sorted."""

    def consumer_window(self, queue: str, n: int) -> None:  # noqa: B027 - optional hook
        """A worker of this process will run at most ``n`` more of ``queue``'s messages at
        a time (its concurrency; ``-n`` when it stops): a backend that prefetches deliveries
        (RabbitMQ) holds no more than the sum. Nothing to do by default."""

    async def ping(self) -> None:
        """Return once every engine this backend needs has answered (a server's or a
        worker's health check); ``ConnectionError`` if one does not. The default looks up
        one queue that need not exist: one indexed read, however many queues there are
        (listing them all was the default, with millions of attention queues a big read)."""
        with contextlib.suppress(QueueNotFound):
            await self.queue_config("fairq.ping")

    # -- messages --------------------------------------------------------------------------
    @abstractmethod
    async def send(self, queue: str, envelopes: list[Envelope]) -> list[str]:
        """Store all envelopes or none; return their ids (the first id for a deduplicated
        one). A full bounded queue raises ``QueueFull`` carrying the overflow mode."""

    @abstractmethod
    async def receive(
        self, queue: str, max_messages: int, visibility_timeout: float | None
    ) -> list[Received]:
        """Lease up to ``max_messages`` visible messages in delivery order."""

    @abstractmethod
    async def ack(self, queue: str, receipts: list[str]) -> list[str]:
        """Delete the messages of current leases; return the receipts that were not current."""

    #: whether :meth:`ack_receive` is one step at the engine (a worker's consumer then sends
    #: the acks of the handlers that freed its slots with its next receive)
    acks_with_receive: ClassVar[bool] = False

    async def ack_receive(
        self, queue: str, receipts: list[str], max_messages: int, visibility_timeout: float | None
    ) -> tuple[list[str], list[Received]]:
        """Ack ``receipts`` (as :meth:`ack`), then receive (as :meth:`receive`): the
        receipts not current and the messages. By default two steps, one after the other;
        a backend that does both in one (one transaction) sets ``acks_with_receive``."""
        lost = await self.ack(queue, receipts)
        return lost, await self.receive(queue, max_messages, visibility_timeout)

    @abstractmethod
    async def nack(self, queue: str, receipt: str, delay: float, error: str | None = None) -> None:
        """End a lease without success: visible after ``delay``, or dead-lettered if it was
        the last allowed attempt, with ``error`` (why it failed, if given) as the dead
        letter's ``fairq.detail``. Raises ``LeaseLost``."""

    @abstractmethod
    async def extend(self, queue: str, receipts: list[str], seconds: float) -> list[str]:
        """Make current leases end ``seconds`` from now; return the receipts not current."""

    @abstractmethod
    async def release(self, queue: str, receipts: list[str]) -> list[str]:
        """End current leases at once without counting the delivery as an attempt."""

    @abstractmethod
    async def dead_letter(self, queue: str, receipt: str, reason: str) -> None:
        """Move the message of a current lease to the dead-letter queue (``rejected``)."""

    @abstractmethod
    async def stats(self, queue: str) -> QueueStats:
        """Counts, oldest age, counters."""

    @abstractmethod
    async def purge(self, queue: str) -> int:
        """Delete every message; return how many."""

    @abstractmethod
    async def peek(self, queue: str, limit: int) -> list[Received]:
        """Messages in delivery order without leasing them."""

    @abstractmethod
    async def redrive(self, queue: str, to: str | None, limit: int | None) -> int:
        """Move up to ``limit`` messages (oldest first) out of a dead-letter queue, to
        ``to`` or back to each one's source queue; return how many moved."""

    # -- topics ----------------------------------------------------------------------------
    @abstractmethod
    async def declare_topic(self, name: str, config: TopicConfig) -> None:
        """Create the topic or update its options."""

    @abstractmethod
    async def topic_config(self, name: str) -> TopicConfig:
        """The options of an existing topic (``TopicNotFound`` otherwise)."""

    @abstractmethod
    async def delete_topic(self, name: str) -> bool:
        """Delete the topic, its subscriptions and their queues; False if there was none."""

    @abstractmethod
    async def list_topics(self, prefix: str = "") -> list[str]:
        """Names of the topics starting with ``prefix``, sorted."""

    @abstractmethod
    async def subscribe(self, subscription: Subscription, config: QueueConfig) -> None:
        """Create or update a subscription and its queue (declared with ``config``) in one
        step. ``ConfigConflict`` if the queue exists and is not this subscription's."""

    @abstractmethod
    async def unsubscribe(self, topic: str, name: str) -> bool:
        """Remove a subscription and delete its queue; False if there was none."""

    @abstractmethod
    async def subscriptions(self, topic: str) -> list[Subscription]:
        """The topic's subscriptions, sorted by name."""

    @abstractmethod
    async def publish(self, topic: str, envelopes: list[Envelope]) -> list[PublishResult]:
        """Copy each envelope into every matching subscription queue — all copies of all
        envelopes, or none (a full ``reject``/``block`` subscription raises ``QueueFull``).
        A repeated ``dedup_id`` within the topic's window answers with the first result."""

    @abstractmethod
    async def topic_stats(self, topic: str) -> TopicStats:
        """The topic's counters."""

    def attach_listeners(  # noqa: B027 - optional hook, nothing to do by default
        self, topic: str, deliver: Callable[[list[tuple[Envelope, str]]], None] | None
    ) -> None:
        """``Topic.listen``'s hook: from now on hand ``deliver`` what *other* brokers (other
        processes, other hosts) publish to ``topic``, as ``(envelope, message id)`` pairs;
        None when this broker has no listener of the topic any more. Backends that carry
        publications between processes (Redis pub/sub) override it; this broker's own
        publishes reach its listeners without the backend."""

    def listen_scope(self) -> Hashable:
        """What identifies this backend's store within the process: brokers with the same
        scope share ephemeral listeners (``Topic.listen``)."""
        return id(self)

    # -- attention -------------------------------------------------------------------------
    # A domain keeps, per key: plan, state, tenant, pending signals, running slices and a
    # token bucket; signals are served tenant by tenant — the scheduler of
    # ``attention_policy`` (virtual time per tenant, a virtual clock per domain; capability
    # ``worker_time_fairness``), or the least recently served tenant first where an engine
    # lists that capability missing — and FIFO within a tenant. Wake-ups for a domain go to
    # the token ``attention:<domain>``.
    @abstractmethod
    async def declare_attention(self, domain: str, config: AttentionConfig) -> None:
        """Create the domain or update its options; ``work_queue`` cannot change once the
        domain has keys (``attention_policy.check_change``: ``ConfigConflict``)."""

    @abstractmethod
    async def attention_config(self, domain: str) -> AttentionConfig:
        """The options of an existing domain (``AttentionNotFound`` otherwise)."""

    @abstractmethod
    async def list_attention(self, prefix: str = "") -> list[str]:
        """Names of the attention domains starting with ``prefix``, sorted."""

    @abstractmethod
    async def delete_attention(self, domain: str) -> bool:
        """Delete the domain's keys, signals and slices (not the work queues)."""

    @abstractmethod
    async def attention_publish(
        self, domain: str, key: str, envelopes: list[Envelope]
    ) -> list[str]:
        """Store work messages in the key's queue (declared on first use) and make sure a
        signal for the key is pending, unless its pending signals and running slices already
        reach its ``max_concurrency`` — one atomic step."""

    @abstractmethod
    async def attention_take(self, domain: str) -> Slice | None:
        """Take signals in fair order until one yields a slice (dropping, parking, blocking,
        rate-limiting or finding empty the others, and counting each); None if no signal is
        due. Taking a slice takes a concurrency token of the key (a lease)."""

    @abstractmethod
    async def attention_receive(
        self, domain: str, token: str, n: int, visibility_timeout: float | None
    ) -> tuple[list[Received], float | None]:
        """Lease up to ``n`` messages of the slice's queue, as many as the key's rate allows;
        with none, the time the rate allows more (None: nothing visible). ``LeaseLost`` if the
        slice's token is gone."""

    @abstractmethod
    async def attention_extend(self, domain: str, token: str) -> bool:
        """Renew the slice's token lease; False if it was lost."""

    @abstractmethod
    async def attention_end(
        self, domain: str, token: str, processed: int, retry_at: float | None
    ) -> None:
        """Release the token, count ``processed`` (every message the slice handled; the
        key counts those :meth:`attention_count` has not counted yet), and signal the key
        again at the tail if it has backlog left (delayed to ``retry_at`` when its rate ran
        out, or to its next due message when only delayed or leased ones are left). A slice
        whose token expired was ended by the sweep, which added what it had counted to the
        domain's processed; its late end counts nothing."""

    async def attention_progress(
        self, domain: str, token: str, key: str, queue: str, receipts: list[str]
    ) -> list[str]:
        """Ack ``receipts`` (messages the running slice ``token`` of ``key`` handled, leased
        from its ``queue``) and count the acked ones as processed for the key now: the slice
        remembers them, so its end counts only the rest, and a slice whose worker dies has
        counted what it acked (they join the domain's count when its token expires). Return
        the receipts that were not current leases. The default acks, then calls
        :meth:`attention_count`; an engine may do both in one step."""
        lost = await self.ack(queue, receipts) if receipts else []
        acked = len(set(receipts) - set(lost))
        if acked:
            await self.attention_count(domain, token, key, acked)
        return lost

    @abstractmethod
    async def attention_count(self, domain: str, token: str, key: str, n: int) -> None:
        """Count ``n`` messages the slice ``token`` of ``key`` handled and acked as the key's
        processed now, and add ``n`` to what the slice has counted (see
        :meth:`attention_progress`). Nothing for a domain that no longer exists."""

    async def attention_finish(
        self,
        domain: str,
        token: str,
        processed: int,
        retry_at: float | None,
        queue: str,
        receipts: list[str],
        key: str,
    ) -> list[str]:
        """Ack ``receipts`` (the slice's last handled messages, of ``key``'s ``queue``), then
        :meth:`attention_end`; return the receipts that were not current leases. An engine
        may do both in one step (Redis: one script). The default makes two calls, the acks
        as :meth:`attention_progress` (acked and counted together: one transaction where the
        engine has them, an ack then the store's count on RabbitMQ), so a worker that dies
        between the two leaves what they acked counted, as it does between any two batches
        of a slice's acks (a plain ack there left them acked and never counted)."""
        lost = (
            await self.attention_progress(domain, token, key, queue, receipts) if receipts else []
        )
        await self.attention_end(domain, token, processed, retry_at)
        return lost

    @abstractmethod
    async def attention_set_resource(
        self, domain: str, key: str, plan: str | None, state: str | None, tenant: str | None
    ) -> None:
        """Create or change a key; re-signal a parked key that becomes active."""

    @abstractmethod
    async def attention_stats(self, domain: str) -> AttentionStats:
        """The domain's counters."""

    @abstractmethod
    async def attention_key_stats(self, domain: str, top: int) -> list[KeyStats]:
        """The ``top`` keys by backlog."""

    @abstractmethod
    async def attention_reconcile(self, domain: str) -> int:
        """Signal every active key with backlog, no pending signal and no running slice."""

    async def attention_tenant_stats(self, domain: str, top: int) -> list[TenantStats]:
        """The ``top`` tenants by worker-time share over the last minute, then backlog."""
        raise Unsupported(
            f"{type(self).__name__} keeps no per-tenant usage yet (capability "
            "'attention.tenant_stats')"
        )

    async def attention_next(self, domain: str) -> SignalHint | None:
        """A cheap look (no write) at whether a take would find a signal now, or when one
        comes due; None (the default) for an engine that cannot tell cheaply, whose takers
        try a take at every wake-up."""
        return None

    def attention_scheduled_here(self, domain: str, due: float) -> bool:
        """Whether this broker itself scheduled the delayed signal due at ``due`` (a slice
        it ended, a message it delayed). It takes such a signal on time; brokers in other
        processes look a moment later, so one due signal costs one take attempt, not one
        per process. True where there are no other processes (the default)."""
        return True

    # -- idempotency -----------------------------------------------------------------------
    # A record per (namespace, key): running (held by the claim whose token it carries,
    # until the end of its lease) or completed (with its result, until the end of the ttl).
    # An expired record counts as absent. SQLite/PostgreSQL: a table keyed UNIQUE on
    # (namespace, key), each method one statement or transaction (INSERT ... ON CONFLICT DO
    # UPDATE ... WHERE expired); Redis: one key per record, SET NX PX or one Lua script.
    @abstractmethod
    async def claim(
        self, namespace: str, key: str, token: str, lease: float, fingerprint: str | None
    ) -> IdempotencyRecord | None:
        """Take the key for ``lease`` seconds under ``token`` (with ``fingerprint``) if it
        has no live record, or a running one of the same ``token`` (its holder claiming
        again), and return None; else change nothing and return the live record. Of
        concurrent claims of one key with distinct tokens exactly one returns None."""

    @abstractmethod
    async def complete_claim(
        self, namespace: str, key: str, token: str, result: bytes | None, ttl: float
    ) -> bool:
        """Mark the key completed with ``result``, kept ``ttl`` seconds from now, if the
        record is still ``token``'s (even past its lease) or there is none; False (nothing
        changed) if another claim has taken the key since."""

    @abstractmethod
    async def release_claim(self, namespace: str, key: str, token: str) -> bool:
        """Delete the running record of ``token``; False if it is not there."""

    @abstractmethod
    async def extend_claim(self, namespace: str, key: str, token: str, lease: float) -> bool:
        """Make ``token``'s running record last ``lease`` seconds from now (taking the key
        again if its record is gone); False if another claim holds or completed it."""

    @abstractmethod
    async def idempotency_record(self, namespace: str, key: str) -> IdempotencyRecord | None:
        """The live record of the key, or None."""

    @abstractmethod
    async def forget_claim(self, namespace: str, key: str) -> bool:
        """Delete the key's live record whatever its state; False if there was none."""

    @abstractmethod
    async def advance_version(self, namespace: str, entity: str, version: Version) -> bool:
        """Store ``version`` for the entity if it is greater than the stored one (or there
        is none) and return True; else change nothing and return False."""

    @abstractmethod
    async def current_version(self, namespace: str, entity: str) -> Version | None:
        """The entity's stored version, or None."""

    # -- waiting rooms ---------------------------------------------------------------------
    # A room is one row of numbers — arrival counter, draw seed and pre-queue size,
    # admission cursor and credit, admitter lease and fence, counters, sold-out and closed
    # flags — and three small indexes: fan id -> arrival number, admission steps (cursor
    # after the step -> time, token expiry) and used tokens. ``room_policy.py`` holds the
    # rules as functions on the row; positions are arithmetic on it, so no method counts
    # fans. Every method first draws the pre-queue's order if the room has opened and not
    # drawn yet (``room_policy.draw_if_due``), in the same atomic step; a room that does not
    # exist raises ``RoomNotFound``. Redis: a hash for the row, a hash for the fans, sorted
    # sets for the steps and used tokens; each method one Lua script.
    @abstractmethod
    async def declare_room(
        self,
        room: str,
        options: Mapping[str, object],
        secret_kid: str | None,
        seed: bytes,
        seed_kid: str,
    ) -> RoomRecord:
        """Create the room with ``options`` (the rest defaults), or set ``options`` on the
        existing one (``admit_rate`` also sets the live rate; ``opens_at`` cannot change
        once drawn: ``ConfigConflict``). ``secret_kid`` (the processes pass a secret): a new
        room stores that key id and no seed, an existing room whose key id differs raises
        ``ConfigConflict`` (``room_policy.other_key``) and changes nothing; without it a new
        room keeps ``seed`` (its generated root secret) and ``seed_kid``, and an existing
        room keeps what it has. A room's key never changes."""

    @abstractmethod
    async def room_record(self, room: str) -> RoomRecord:
        """The room's set-up."""

    @abstractmethod
    async def list_rooms(self, prefix: str = "") -> list[str]:
        """Names of the rooms starting with ``prefix``, sorted."""

    @abstractmethod
    async def delete_room(self, room: str) -> bool:
        """Delete the room and everything of it; False if there was none."""

    @abstractmethod
    async def room_join(self, room: str, fans: list[str]) -> list[Place]:
        """Give each new fan the next arrival number (a fan already in the room keeps its
        own) and answer where each stands; in a sold-out or closed room store nothing and
        answer that state (``seq`` None)."""

    @abstractmethod
    async def room_status(self, room: str, seq: int) -> Place:
        """Where the fan who arrived ``seq``-th stands (``room_policy.place``)."""

    @abstractmethod
    async def room_tick(self, room: str, holder: str, lease: float) -> TickResult:
        """One admission step: take or renew the admitter lease for ``holder`` (for
        ``lease`` seconds); if it holds it, expire lapsed tokens and admit what the rate's
        credit allows (``room_policy.admission_allowance``)."""

    @abstractmethod
    async def room_release_admitter(self, room: str, holder: str) -> bool:
        """Give up ``holder``'s admitter lease; False if it did not hold it."""

    @abstractmethod
    async def room_admit(self, room: str, n: int) -> int:
        """Admit the next ``n`` waiting fans at once; return how many."""

    @abstractmethod
    async def room_set_rate(self, room: str, rate: float) -> None:
        """Set the live admit rate."""

    @abstractmethod
    async def room_consume(self, room: str, seq: int) -> str:
        """Burn the token of the fan who arrived ``seq``-th (``room_policy.consume``):
        ``ok``, ``used``, ``expired`` or ``not_admitted``."""

    @abstractmethod
    async def room_sold_out(self, room: str) -> int:
        """Raise the sold-out flag; return how many fans were waiting then."""

    @abstractmethod
    async def room_close(self, room: str) -> None:
        """Close the room (the sale is over)."""

    @abstractmethod
    async def room_stats(self, room: str) -> RoomStats:
        """The room's numbers (after expiring lapsed tokens)."""

    # -- the caller's transaction (SPEC §11) ------------------------------------------------
    # ``connection`` is the caller's own database connection, opaque here: an engine that can
    # run a step inside the caller's transaction (PostgreSQL) overrides these, so the step
    # commits or rolls back with the caller's own writes. The others raise ``Unsupported``.
    def _no_transactions(self, what: str) -> Unsupported:
        return Unsupported(
            f"{what}(connection=...) joins the caller's database transaction, which only the "
            f"PostgreSQL backend can do ({type(self).__name__} cannot)"
        )

    async def send_in(self, connection: object, queue: str, envelopes: list[Envelope]) -> list[str]:
        """``send`` inside the caller's transaction (the outbox)."""
        raise self._no_transactions("send")

    async def publish_in(
        self, connection: object, topic: str, envelopes: list[Envelope]
    ) -> list[PublishResult]:
        """``publish`` inside the caller's transaction."""
        raise self._no_transactions("publish")

    async def attention_publish_in(
        self, connection: object, domain: str, key: str, envelopes: list[Envelope]
    ) -> list[str]:
        """``attention_publish`` inside the caller's transaction."""
        raise self._no_transactions("Attention.publish")

    async def ack_in(self, connection: object, queue: str, receipts: list[str]) -> list[str]:
        """``ack`` inside the caller's transaction (the inbox): the lease is settled only if
        the caller commits; a rollback leaves it as it was."""
        raise self._no_transactions("ack")

    async def claim_in(
        self,
        connection: object,
        namespace: str,
        key: str,
        token: str,
        ttl: float,
        fingerprint: str | None,
    ) -> IdempotencyRecord | None:
        """Record ``key`` as done (for ``ttl`` seconds) inside the caller's transaction, if
        it has no live record; else change nothing and return the live record. The record
        commits with the caller's own writes: of concurrent claims exactly one commits."""
        raise self._no_transactions("claim")

    async def complete_claim_in(
        self,
        connection: object,
        namespace: str,
        key: str,
        token: str,
        result: bytes | None,
        ttl: float,
    ) -> bool:
        """``complete_claim`` inside the caller's transaction (the inbox claim's result)."""
        raise self._no_transactions("Claim.complete")

    async def release_claim_in(
        self, connection: object, namespace: str, key: str, token: str
    ) -> bool:
        """Drop the record of an inbox claim (``claim_in``) inside the caller's transaction,
        so the key is free again once it commits; False if it is not ``token``'s."""
        raise self._no_transactions("Claim.release")

    # -- counters (for engines that keep their messages elsewhere) --------------------------
    # An engine that has no counters of its own (RabbitMQ) keeps them in a store backend:
    # named integers per scope, added to atomically. Optional: a backend that cannot keep
    # them raises ``Unsupported`` and cannot be used as such a store.
    async def add_counts(self, scope: str, counts: Mapping[str, int]) -> None:
        """Add each of ``counts`` to the scope's counter of that name (absent ones are 0)."""
        raise Unsupported(f"{type(self).__name__} keeps no counters for other engines")

    async def read_counts(self, scope: str) -> dict[str, int]:
        """The scope's counters (an unknown scope has none)."""
        raise Unsupported(f"{type(self).__name__} keeps no counters for other engines")

    async def drop_counts(self, scope: str) -> None:
        """Forget the scope's counters."""
        raise Unsupported(f"{type(self).__name__} keeps no counters for other engines")

    # -- wake-ups --------------------------------------------------------------------------
    async def next_due(self) -> float | None:
        """When the next delayed message or lease comes due (None: nothing scheduled)."""
        return None

    def watch(self, poke: Callable[[], None]) -> bool:
        """Start OS change notifications for the pulse, calling ``poke()`` whenever another
        process may have changed something; False (the default) if there are none here, and
        the pulse polls :meth:`changed_elsewhere` every ``poll_interval`` instead."""
        return False

    def watching(self) -> bool:
        """Whether the notifications :meth:`watch` started are still on."""
        return False

    def unwatch(self) -> None:  # noqa: B027 - optional hook, nothing to do by default
        """Stop what :meth:`watch` started."""

    async def changed_elsewhere(self) -> bool:
        """True if another process may have changed something since the last call."""
        return False
