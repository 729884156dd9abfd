"""The RabbitMQ backend's queues: declarations, sends with publisher confirms, leases over
unacked deliveries, dead letters, stats.

What fairq keeps beside each message (in AMQP properties and headers):

* ``message_id`` — the fairq id (it encodes the send time: ``enqueued_at``);
* headers — the attributes; fairq's own start with ``fairq-`` and are not shown:
  ``fairq-prior``, deliveries that ended before this copy was published (a nack with a
  delay, a release, a redrive start over with a new copy). The attempt of a delivery is
  ``fairq-prior + x-delivery-count + 1`` on a quorum queue (RabbitMQ counts every return:
  a nack, an expired lease, a consumer that died) and ``fairq-prior + redelivered + 1`` on a
  classic one (which only says "returned at least once").

fairq itself decides attempts, dead letters and lease ends (the broker cannot see a
visibility timeout): a lease that runs out is nacked back by the process that holds it;
a delivery already past ``max_attempts`` (its consumers died) is dead-lettered, not
delivered. Dead letters fairq makes are a publish (confirmed) of a copy with the
``fairq.*`` attributes, then an ack of the original: a crash between the two leaves both (at
least once). What the broker dead-letters itself (retention TTL, ``drop-head``) arrives in
the dead-letter queue with RabbitMQ's ``x-death`` header, read back as the same attributes.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ...clock import Clock
from ...errors import (
    ConfigConflict,
    ConnectionError,
    LeaseLost,
    QueueFull,
    QueueNotFound,
    Unsupported,
)
from ...message import (
    Received,
    format_id,
    id_time,
    make_receipt,
    next_id_base,
    parse_id,
    parse_receipt,
)
from ...model.queues import QUEUE_COUNTERS, Envelope, QueueConfig, QueueStats
from ..base import Backend
from ..rules import check_priorities, dead_letter_attributes, plan_dedup, redrive_attributes
from . import topology
from .feeds import Delivered, Feed, Lease
from .link import AmqpUrl, DeliveryError, Link, driver_errors, spec
from .management import Management

__all__ = ["AmqpQueues"]

log = logging.getLogger("fairq.amqp")

PRIOR = "fairq-prior"
GROUP = "fairq-group"
_HIDDEN_PREFIX = "fairq-"
_RABBIT_HEADERS = ("x-death", "x-delivery-count", "x-first-death-", "x-last-death-")
_DEATH_REASONS = {
    "expired": "expired",
    "maxlen": "overflow",
    "rejected": "rejected",
    "delivery_limit": "max_attempts",
}
_ID_MASK = 2**63 - 1  # a receipt's first part: the message id, as 16 hex digits
_CONFIG_TTL = 2.0  # seconds a queue's options are cached (other processes' changes show then)
_FLUSH_EVERY = 0.5  # seconds between writes of the counters to the store


def _hidden(key: str) -> bool:
    return key.startswith(_HIDDEN_PREFIX) or key.startswith(_RABBIT_HEADERS)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def attributes_of(
    headers: Mapping[str, Any], message_id: str, level_queues: frozenset[str]
) -> dict[str, str]:
    """The fairq attributes of a delivery: its own headers, plus the ``fairq.*`` dead-letter
    attributes when the broker dead-lettered it (the newest ``x-death`` entry)."""
    attrs = {k: _text(v) for k, v in headers.items() if not _hidden(k)}
    deaths = headers.get("x-death")
    if deaths:
        last = deaths[0]
        source = _text(last.get("queue", ""))
        if source and source not in level_queues:  # the delay wheel's hops are not deaths
            reason = _DEATH_REASONS.get(_text(last.get("reason", "")), "rejected")
            attrs["fairq.reason"] = reason
            attrs["fairq.source"] = source
            attrs.setdefault("fairq.original_id", message_id)
            attrs["fairq.attempts"] = str(
                int(headers.get(PRIOR, 0)) + int(headers.get("x-delivery-count", 0))
            )
    return attrs


class AmqpQueues(Backend):
    """Queues on RabbitMQ; the store keeps the options, counters and dedup records."""

    poll_interval = 5.0  # deliveries are pushed: the pulse only wakes waiters for lease ends

    def __init__(self, url: AmqpUrl, clock: Clock, store: Backend) -> None:
        super().__init__(clock)
        self.url = url
        self.store = store
        self.link = Link(url)
        self.link.on_reconnect.append(self._reconnected)
        self._configs: dict[str, tuple[QueueConfig, float]] = {}
        self._feeds: dict[str, Feed] = {}
        self._leases: dict[str, Lease] = {}
        self._deadlines: list[tuple[float, str]] = []  # (deadline, receipt), lazily cleaned
        self._counts: dict[str, dict[str, int]] = {}
        self._bound: set[str] = set()  # queues bound on fairq/due in this process
        self._wheel_ready = False
        self._wheel_lock = asyncio.Lock()
        self._level_queues = frozenset(topology.level_queue(i) for i in range(topology.LEVELS))
        self._last_id = 0
        self._tag = int.from_bytes(os.urandom(4), "big") | 1
        self._seq = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        self._kick = asyncio.Event()
        self._closed = False
        self._management: Management | None = None
        if url.management is not None:
            self._management = Management(url.management, url.user, url.password, timeout=2.0)

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:
        await self.link.open()
        admin = await self.link.channel("admin")
        with driver_errors("declaring fairq's exchanges", self.url.masked):
            await admin.exchange_declare(topology.DLX, exchange_type="direct", durable=True)
            await admin.exchange_declare(topology.DUE, exchange_type="topic", durable=True)
        await self.link.channel("publish", confirms=True)
        self._tasks.append(asyncio.create_task(self._lease_timer(), name="fairq-amqp-leases"))
        self._tasks.append(asyncio.create_task(self._flusher(), name="fairq-amqp-counts"))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await self._return_held()
        with contextlib.suppress(Exception):
            await self._flush_counts()
        for feed in self._feeds.values():
            await feed.close()
        self._feeds.clear()
        self._leases.clear()
        self.wakeups.close()
        await self.link.close()
        await self.store.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ConnectionError(f"the broker on {self.url.masked!r} is closed")

    def _reconnected(self) -> None:
        """A new connection: every lease and held delivery of the old one is gone (the broker
        returned them to their queues); waiters try again."""
        self._leases.clear()
        self._deadlines.clear()
        for feed in self._feeds.values():
            feed.held.clear()
            feed.leases = 0
        self._bound.clear()
        self._wheel_ready = False
        self.wakeups.notify_all()

    # -- counters --------------------------------------------------------------------------
    def _count(self, queue: str, name: str, n: int = 1) -> None:
        counts = self._counts.get(queue)
        if counts is None:
            counts = self._counts[queue] = {}
        counts[name] = counts.get(name, 0) + n

    async def _flush_counts(self) -> None:
        pending, self._counts = self._counts, {}
        for queue, counts in pending.items():
            try:
                await self.store.add_counts(f"queue:{queue}", counts)
            except Exception:
                for name, n in counts.items():  # keep them for the next flush
                    self._count(queue, name, n)
                raise

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(_FLUSH_EVERY)
            if self._counts:
                try:
                    await self._flush_counts()
                except Exception:
                    log.warning("could not write queue counters to the store", exc_info=True)

    # -- options ---------------------------------------------------------------------------
    async def _config(self, name: str) -> QueueConfig:
        self._check_open()
        hit = self._configs.get(name)
        now = time.monotonic()
        if hit is not None and now - hit[1] < _CONFIG_TTL:
            return hit[0]
        config = await self.store.queue_config(name)  # QueueNotFound
        self._configs[name] = (config, now)
        return config

    async def _declare_rabbit(self, name: str, config: QueueConfig) -> None:
        args = topology.queue_arguments(name, config)
        admin = await self.link.channel("admin")
        try:
            with driver_errors(f"declaring queue {name!r}", self.url.masked):
                await admin.queue_declare(name, durable=True, arguments=args)
        except ConfigConflict as exc:
            raise ConfigConflict(
                f"queue {name!r} exists in RabbitMQ with other arguments than fairq's "
                f"(wanted {args}): {exc}"
            ) from exc
        await self._bind_due(name)

    async def _bind_due(self, name: str) -> None:
        """Bind the queue where delays end (a name too long for a routing key has no delays)."""
        pattern = topology.due_pattern(name)
        if len(pattern) <= topology.ROUTING_KEY_MAX:
            admin = await self.link.channel("admin")
            with driver_errors(f"binding queue {name!r}", self.url.masked):
                await admin.queue_bind(name, topology.DUE, routing_key=pattern)
        self._bound.add(name)

    async def _bind_dead_letters(self, name: str, old: str | None, new: str | None) -> None:
        admin = await self.link.channel("admin")
        with driver_errors(f"routing the dead letters of {name!r}", self.url.masked):
            if old is not None and old != new:
                await admin.queue_unbind(old, topology.DLX, routing_key=name)
            if new is not None:
                await admin.queue_bind(new, topology.DLX, routing_key=name)

    async def declare_queue(self, name: str, config: QueueConfig) -> None:
        await self._prepare_queue(name, config)
        await self.store.declare_queue(name, config)  # also registers a new dead-letter queue
        self._declared(name, config)

    async def _prepare_queue(self, name: str, config: QueueConfig) -> None:
        """The RabbitMQ side of declaring a queue (the store registers it after)."""
        self._check_open()
        try:
            old: QueueConfig | None = await self.store.queue_config(name)
        except QueueNotFound:
            old = None
        if old is not None:
            old.check_change(name, config)
            if topology.queue_arguments(name, old) != topology.queue_arguments(name, config):
                raise Unsupported(
                    f"queue {name!r}: retention, max_length and overflow are RabbitMQ queue "
                    "arguments, fixed when the queue is declared; delete the queue and declare "
                    "it again (capability 'queues.change_arguments')"
                )
        await self._declare_rabbit(name, config)
        dlq = config.dead_letter
        if dlq is not None:
            try:
                await self.store.queue_config(dlq)
            except QueueNotFound:
                await self._declare_rabbit(dlq, QueueConfig.for_dead_letters())
        await self._bind_dead_letters(name, old.dead_letter if old else None, dlq)

    def _declared(self, name: str, config: QueueConfig) -> None:
        self._configs[name] = (config, time.monotonic())
        self._configs.pop(config.dead_letter or "", None)
        self.wakeups.notify([name])

    async def queue_config(self, name: str) -> QueueConfig:
        return await self._config(name)

    async def delete_queue(self, name: str) -> bool:
        self._check_open()
        existed = await self.store.delete_queue(name)
        self._configs.pop(name, None)
        feed = self._feeds.pop(name, None)
        if feed is not None:
            await feed.close()
        for receipt in [r for r, lease in self._leases.items() if lease.queue == name]:
            del self._leases[receipt]
        admin = await self.link.channel("admin")
        with driver_errors(f"deleting queue {name!r}", self.url.masked):
            await admin.queue_delete(name)
        with contextlib.suppress(Exception):
            await self.store.drop_counts(f"queue:{name}")
        self._counts.pop(name, None)
        self.wakeups.notify([name])
        return existed

    async def list_queues(self, prefix: str = "") -> list[str]:
        self._check_open()
        return await self.store.list_queues(prefix)

    # -- sending ---------------------------------------------------------------------------
    def _new_id(self) -> str:
        self._last_id = next_id_base(self._last_id, self.clock.now())
        return format_id(self._last_id)

    async def _ensure_wheel(self) -> None:
        if self._wheel_ready:
            return
        async with self._wheel_lock:
            if self._wheel_ready:
                return
            admin = await self.link.channel("admin")
            with driver_errors("declaring the delay queues", self.url.masked):
                levels = topology.wheel()
                for exchange, _, _, _ in levels:
                    await admin.exchange_declare(exchange, exchange_type="topic", durable=True)
                for exchange, queue, args, bindings in levels:
                    await admin.queue_declare(queue, durable=True, arguments=args)
                    for kind, dest, pattern in bindings:
                        if kind == "queue":
                            await admin.queue_bind(dest, exchange, routing_key=pattern)
                        else:
                            await admin.exchange_bind(dest, exchange, routing_key=pattern)
            self._wheel_ready = True

    async def _publish(
        self,
        items: Iterable[tuple[str, str, bytes, dict[str, Any], int, str]],
        what: str,
    ) -> list[bool]:
        """Publish (exchange, routing key, body, headers, priority, id) items persistently and
        wait for every confirm; True per item the broker took, False per one it refused."""
        ch = await self.link.channel("publish", confirms=True)
        props = spec.Basic.Properties
        with driver_errors(what, self.url.masked):
            confirms = await asyncio.gather(
                *[
                    ch.basic_publish(
                        body,
                        exchange=exchange,
                        routing_key=key,
                        properties=props(
                            delivery_mode=2,
                            message_id=mid,
                            headers=headers or None,
                            priority=priority or None,
                        ),
                    )
                    for exchange, key, body, headers, priority, mid in items
                ],
                return_exceptions=True,
            )
            took = []
            for c in confirms:
                if isinstance(c, DeliveryError):
                    took.append(False)  # a nack: the queue refused (x-overflow reject-publish)
                elif isinstance(c, BaseException):
                    raise c
                else:
                    took.append(True)
        return took

    async def _route(self, queue: str, delay: float) -> tuple[str, str]:
        if delay > 0:
            await self._ensure_wheel()
            route = topology.delay_route(delay, queue)
            if queue not in self._bound:
                await self._bind_due(queue)
            return route
        return "", queue

    async def _store_copies(
        self, queue: str, config: QueueConfig, envelopes: list[Envelope], ids: list[str]
    ) -> None:
        """Publish new messages to ``queue``; ``QueueFull`` if a bounded queue refused any."""
        items = []
        for env, mid in zip(envelopes, ids, strict=True):
            exchange, key = await self._route(queue, env.delay)
            headers: dict[str, Any] = dict(env.attributes)
            if env.group is not None:
                headers[GROUP] = env.group
            items.append((exchange, key, env.body, headers, env.priority, mid))
        took = await self._publish(items, f"sending to queue {queue!r}")
        stored = sum(took)
        if stored:
            self._count(queue, "sent", stored)
        if stored < len(took):
            raise QueueFull(
                queue,
                config.max_length or 0,
                f"RabbitMQ refused {len(took) - stored} of {len(took)} messages "
                f"(x-overflow reject-publish); {stored} were stored",
                config.overflow,
            )

    async def send(self, queue: str, envelopes: list[Envelope]) -> list[str]:
        config = await self._config(queue)
        await self._expire_leases()  # a lease that ran out comes back before what is sent now
        check_priorities(queue, envelopes, config.max_priority)
        ids = [self._new_id() for _ in envelopes]
        fresh, claimed, answer = await self._dedup(
            f"queue:{queue}", config.dedup_window, envelopes, ids
        )
        if config.max_length is not None and len(fresh) > config.max_length:
            await self._undedup(f"queue:{queue}", claimed)
            raise QueueFull(queue, config.max_length, "the batch is larger than max_length")
        try:
            await self._store_copies(
                queue, config, [envelopes[i] for i in fresh], [ids[i] for i in fresh]
            )
        except BaseException:
            await self._undedup(f"queue:{queue}", claimed)
            raise
        return answer

    async def _dedup(
        self, scope: str, window: float, envelopes: list[Envelope], ids: list[str]
    ) -> tuple[list[int], list[str], list[str]]:
        """Claim each new ``dedup_id`` in the store (its record holds the first id for the
        window): the indexes to store, the claimed dedup ids, the ids to answer."""
        if window <= 0 or all(e.dedup_id is None for e in envelopes):
            return list(range(len(envelopes))), [], ids
        earlier: dict[str, str] = {}
        claimed: list[str] = []

        def sent_before(dedup_id: str) -> int | None:
            return parse_id(earlier[dedup_id]) if dedup_id in earlier else None

        for env, mid in zip(envelopes, ids, strict=True):
            key = env.dedup_id
            if key is None or key in earlier or key in claimed:
                continue
            record = await self.store.claim(f"fairq.dedup:{scope}", key, mid, window, mid)
            if record is None:
                claimed.append(key)
            else:
                earlier[key] = record.fingerprint or mid
        plan = plan_dedup(envelopes, sent_before)
        index = {id(e): i for i, e in enumerate(envelopes)}
        fresh = [index[id(e)] for e in plan.fresh]
        answer = plan.answer([parse_id(ids[i]) for i in fresh])
        return fresh, claimed, answer

    async def _undedup(self, scope: str, claimed: list[str]) -> None:
        for key in claimed:
            with contextlib.suppress(Exception):
                await self.store.forget_claim(f"fairq.dedup:{scope}", key)

    # -- receiving -------------------------------------------------------------------------
    def _feed(self, queue: str) -> Feed:
        feed = self._feeds.get(queue)
        if feed is None:
            feed = self._feeds[queue] = Feed(queue, self.link, self.url.prefetch, self._delivered)
        return feed

    def _delivered(self, queue: str) -> None:
        self.wakeups.notify([queue])

    async def receive(
        self, queue: str, max_messages: int, visibility_timeout: float | None
    ) -> list[Received]:
        config = await self._config(queue)
        await self._expire_leases()
        feed = self._feed(queue)
        await feed.start()
        vt = config.visibility_timeout if visibility_timeout is None else visibility_timeout
        out: list[Received] = []
        empty_answers = 0
        while len(out) < max_messages:
            if feed.held:
                delivered = feed.held.popleft()
            else:
                got = await feed.get()
                if got is None:
                    empty_answers += 1
                    if empty_answers >= 2 and not feed.held:
                        break
                    continue
                delivered = got
            received = await self._lease(feed, config, delivered, vt)
            if received is not None:
                out.append(received)
        return out

    async def _lease(
        self, feed: Feed, config: QueueConfig, delivered: Delivered, vt: float
    ) -> Received | None:
        """Start a lease on a delivery (or dead-letter it if it is past its attempts)."""
        props = delivered.header.properties
        headers = dict(props.headers or {})
        prior = int(headers.get(PRIOR, 0))
        if topology.quorum(config):
            returned = int(headers.get("x-delivery-count", 0))
        else:
            returned = 1 if delivered.delivery.redelivered else 0
        attempt = prior + returned + 1
        mid = props.message_id or self._new_id()
        try:
            enqueued_at = id_time(parse_id(mid))
        except ValueError:
            enqueued_at = self.clock.now()
        now = self.clock.now()
        lease = Lease(
            feed.queue,
            feed,
            feed.generation,
            delivered.delivery.delivery_tag,
            mid,
            delivered.body,
            headers,
            props.priority or 0,
            attempt,
            now + vt,
            enqueued_at,
        )
        if config.max_attempts is not None and attempt > config.max_attempts:
            # its consumers died holding it: it had its attempts, it is not delivered again
            await self._dead_letter(lease, config, "max_attempts", attempts=attempt - 1)
            return None
        try:
            number = parse_id(mid) & _ID_MASK
        except ValueError:  # a message from another publisher: any number will do
            number = self._tag
        receipt = make_receipt(number, (self._tag << 32) | next(self._seq))
        self._leases[receipt] = lease
        feed.leases += 1
        heapq.heappush(self._deadlines, (lease.deadline, receipt))
        self._kick.set()
        if attempt > 1:
            self._count(feed.queue, "redelivered")
        return Received(
            mid,
            delivered.body,
            attributes_of(headers, mid, self._level_queues),
            attempt,
            enqueued_at,
            lease.priority,
            _text(headers[GROUP]) if GROUP in headers else None,
            receipt,
            feed.queue,
        )

    # -- settling --------------------------------------------------------------------------
    def _current(self, queue: str, receipt: str) -> Lease | None:
        parse_receipt(receipt)  # InvalidMessage for one fairq never made
        lease = self._leases.get(receipt)
        if lease is None or lease.queue != queue:
            return None
        if lease.generation != self.link.generation or not lease.feed.live():
            self._end(receipt)
            return None
        if lease.deadline <= self.clock.now():
            return None  # ran out: _expire_leases returns it
        return lease

    def _end(self, receipt: str) -> Lease | None:
        lease = self._leases.pop(receipt, None)
        if lease is not None:
            lease.feed.leases -= 1
        return lease

    async def _settle(self, lease: Lease, how: str, requeue: bool = False) -> None:
        """Ack (``ack``) or nack (``nack``, requeue or not) the lease's delivery."""
        ch = lease.feed.channel
        if ch is None or ch.is_closed:
            raise LeaseLost([], "the channel of this delivery closed")
        with driver_errors(f"settling a delivery of {lease.queue!r}", self.url.masked):
            if how == "ack":
                await ch.basic_ack(lease.tag, wait=False)
            else:
                await ch.basic_nack(lease.tag, requeue=requeue)

    async def ack(self, queue: str, receipts: list[str]) -> list[str]:
        await self._config(queue)
        await self._expire_leases()
        lost = []
        acked = 0
        for receipt in receipts:
            lease = self._current(queue, receipt)
            if lease is None:
                lost.append(receipt)
                continue
            self._end(receipt)
            await self._settle(lease, "ack")
            acked += 1
        if acked:
            self._count(queue, "acked", acked)
            self.wakeups.notify([queue])
        return lost

    def _one(self, queue: str, receipt: str) -> Lease:
        lease = self._current(queue, receipt)
        if lease is None:
            raise LeaseLost([receipt])
        self._end(receipt)
        return lease

    async def nack(self, queue: str, receipt: str, delay: float) -> None:
        config = await self._config(queue)
        await self._expire_leases()
        lease = self._one(queue, receipt)
        self._count(queue, "nacked")
        await self._give_back(lease, config, delay)

    async def _give_back(self, lease: Lease, config: QueueConfig, delay: float) -> None:
        """A delivery ended without success (nack or expired lease): visible again after
        ``delay``, or dead-lettered if it was the last allowed attempt."""
        if config.max_attempts is not None and lease.attempt >= config.max_attempts:
            await self._dead_letter(lease, config, "max_attempts")
        elif delay > 0:
            await self._copy(lease, lease.queue, lease.attempt, delay)
        elif topology.quorum(config):
            lease.feed.returns(lease.message_id)
            await self._settle(lease, "nack", requeue=True)  # to the tail, x-delivery-count + 1
        else:
            await self._copy(lease, lease.queue, lease.attempt, 0.0)
        self.wakeups.notify([lease.queue])

    async def _copy(self, lease: Lease, queue: str, prior: int, delay: float) -> None:
        """Publish a copy of the leased message to ``queue`` (after ``delay``) whose deliveries
        start after ``prior`` attempts, then ack the original."""
        headers = {k: v for k, v in lease.headers.items() if not _hidden(k)}
        if prior:
            headers[PRIOR] = prior
        exchange, key = await self._route(queue, delay)
        (took,) = await self._publish(
            [(exchange, key, lease.body, headers, lease.priority, lease.message_id)],
            f"requeueing a message of {lease.queue!r}",
        )
        if not took:
            raise QueueFull(queue, 0, "RabbitMQ refused the message back", "reject")
        await self._settle(lease, "ack")

    async def _dead_letter(
        self,
        lease: Lease,
        config: QueueConfig,
        reason: str,
        detail: str | None = None,
        attempts: int | None = None,
    ) -> None:
        if reason == "expired":
            self._count(lease.queue, "expired")
        target = config.dead_letter
        if target is None:
            self._count(lease.queue, "discarded")
            await self._settle(lease, "ack")
            return
        attrs = attributes_of(lease.headers, lease.message_id, self._level_queues)
        headers: dict[str, Any] = dead_letter_attributes(
            attrs,
            reason,
            lease.queue,
            lease.message_id,
            lease.attempt if attempts is None else attempts,
            detail,
        )
        (took,) = await self._publish(
            [("", target, lease.body, headers, 0, self._new_id())],
            f"dead-lettering a message of {lease.queue!r}",
        )
        if not took:
            raise QueueFull(target, 0, "the dead-letter queue refused the message", "reject")
        await self._settle(lease, "ack")
        self._count(lease.queue, "dead_lettered")

    async def extend(self, queue: str, receipts: list[str], seconds: float) -> list[str]:
        await self._config(queue)
        await self._expire_leases()
        lost = []
        now = self.clock.now()
        for receipt in receipts:
            lease = self._current(queue, receipt)
            if lease is None:
                lost.append(receipt)
                continue
            lease.deadline = now + seconds
            heapq.heappush(self._deadlines, (lease.deadline, receipt))
        self._kick.set()
        return lost

    async def release(self, queue: str, receipts: list[str]) -> list[str]:
        await self._config(queue)
        await self._expire_leases()
        lost = []
        for receipt in receipts:
            lease = self._current(queue, receipt)
            if lease is None:
                lost.append(receipt)
                continue
            self._end(receipt)
            await self._copy(lease, queue, lease.attempt - 1, 0.0)
        self.wakeups.notify([queue])
        return lost

    async def dead_letter(self, queue: str, receipt: str, reason: str) -> None:
        config = await self._config(queue)
        await self._expire_leases()
        lease = self._one(queue, receipt)
        await self._dead_letter(lease, config, "rejected", reason)
        self.wakeups.notify([queue])

    # -- lease ends ------------------------------------------------------------------------
    async def _expire_leases(self) -> None:
        """Give back every lease of this process whose visibility timeout has run out."""
        heap = self._deadlines
        if not heap:
            return
        now = self.clock.now()
        while heap and heap[0][0] <= now:
            deadline, receipt = heapq.heappop(heap)
            lease = self._leases.get(receipt)
            if lease is None or lease.deadline != deadline:
                continue  # settled, or extended (a later entry)
            self._end(receipt)
            if lease.generation != self.link.generation or not lease.feed.live():
                continue  # its channel closed: the broker has it back already
            try:
                config = await self._config(lease.queue)
                await self._give_back(lease, config, 0.0)
            except QueueNotFound:
                continue
            except Exception:
                log.warning("could not return an expired lease of %s", lease.queue, exc_info=True)

    async def _lease_timer(self) -> None:
        """Return expired leases while nobody calls in (other processes wait for them)."""
        while True:
            self._kick.clear()
            heap = self._deadlines
            sleep = 1.0
            if heap:
                sleep = min(sleep, max(0.0, heap[0][0] - self.clock.now()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(sleep):
                    await self._kick.wait()
            try:
                await self._expire_leases()
            except Exception:
                log.warning("lease timer failed", exc_info=True)

    async def _return_held(self) -> None:
        """On close: give back what the feeds prefetched but nobody leased, each as a copy
        with its attempts so far (a channel close would count one more on quorum queues)."""
        for feed in list(self._feeds.values()):
            held = await feed.stop()
            if not held or not feed.live():
                continue
            config = await self._config(feed.queue)
            for delivered in held:
                headers = dict(delivered.header.properties.headers or {})
                lease = Lease(
                    feed.queue,
                    feed,
                    feed.generation,
                    delivered.delivery.delivery_tag,
                    delivered.header.properties.message_id or self._new_id(),
                    delivered.body,
                    headers,
                    delivered.header.properties.priority or 0,
                    0,
                    0.0,
                    0.0,
                )
                prior = int(headers.get(PRIOR, 0))
                if topology.quorum(config):
                    prior += int(headers.get("x-delivery-count", 0))
                await self._copy(lease, feed.queue, prior, 0.0)

    async def next_due(self) -> float | None:
        heap = self._deadlines
        while heap and heap[0][1] not in self._leases:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    # -- managing --------------------------------------------------------------------------
    async def _ready(self, queue: str) -> int:
        admin = await self.link.channel("admin")
        with driver_errors(f"reading queue {queue!r}", self.url.masked):
            ok = await admin.queue_declare(queue, passive=True)
        return int(ok.message_count or 0)

    async def stats(self, queue: str) -> QueueStats:
        config = await self._config(queue)
        await self._expire_leases()
        await self._flush_counts()
        feed = self._feeds.get(queue)
        if feed is not None:
            await feed.settled()
        ready = await self._ready(queue)
        held = len(feed.held) if feed is not None else 0
        leases = [lease for lease in self._leases.values() if lease.queue == queue]
        in_flight = len(leases)
        if feed is None:  # this process does not consume it (a dashboard): ask the broker
            in_flight = await self._unacked(queue)
        counts = await self.store.read_counts(f"queue:{queue}")
        now = self.clock.now()
        known = [lease.enqueued_at for lease in leases]
        if feed is not None:
            known += [self._enqueued(d) for d in feed.held]
        oldest = max(0.0, now - min(known)) if known else 0.0
        slo = config.freshness_slo
        return QueueStats(
            visible=ready + held,
            delayed=0,
            in_flight=in_flight,
            oldest_age=oldest,
            freshness_slo=slo,
            breaching=slo is not None and oldest > slo,
            **{name: counts.get(name, 0) for name in QUEUE_COUNTERS},
        )

    async def _unacked(self, queue: str) -> int:
        """Deliveries of ``queue`` other processes hold, as the management API last sampled
        them (every 5 s by default); 0 when the API is off or unreachable."""
        api = self._management
        if api is None:
            return 0
        try:
            info = await api.queue(self.url.vhost, queue)
        except Exception:
            log.debug("management API unavailable for %s", queue, exc_info=True)
            return 0
        return int(info.get("messages_unacknowledged") or 0)

    def _enqueued(self, delivered: Delivered) -> float:
        try:
            return id_time(parse_id(delivered.header.properties.message_id or ""))
        except ValueError:
            return self.clock.now()

    async def purge(self, queue: str) -> int:
        await self._config(queue)
        admin = await self.link.channel("admin")
        with driver_errors(f"purging queue {queue!r}", self.url.masked):
            ok = await admin.queue_purge(queue)
        n = int(ok.message_count or 0)
        feed = self._feeds.get(queue)
        if feed is not None and feed.channel is not None and feed.live():
            while feed.held:
                delivered = feed.held.popleft()
                with driver_errors(f"purging queue {queue!r}", self.url.masked):
                    await feed.channel.basic_ack(delivered.delivery.delivery_tag)
                n += 1
        for receipt in [r for r, lease in self._leases.items() if lease.queue == queue]:
            lease = self._end(receipt)
            if lease is not None and lease.feed.live():
                await self._settle(lease, "ack")
                n += 1
        self.wakeups.notify([queue])
        return n

    async def peek(self, queue: str, limit: int) -> list[Received]:
        await self._config(queue)
        raise Unsupported(
            "peek is not available on RabbitMQ: reading a message without taking it moves it "
            "to the tail of a quorum queue and counts a delivery (capability 'peek')"
        )

    async def redrive(self, queue: str, to: str | None, limit: int | None) -> int:
        await self._config(queue)
        if to is not None:
            await self._config(to)
        ch = await self.link.channel(f"redrive:{queue}")
        moved = kept = 0
        try:
            with driver_errors(f"redriving {queue!r}", self.url.masked):
                ok = await ch.queue_declare(queue, passive=True)
            # one pass over what is there now; what stays goes back as a copy at the tail
            for _ in range(int(ok.message_count or 0)):
                if limit is not None and moved >= limit:
                    break
                with driver_errors(f"redriving {queue!r}", self.url.masked):
                    got = await ch.basic_get(queue, no_ack=False)
                if isinstance(got.delivery, spec.Basic.GetEmpty):
                    break
                props = got.header.properties
                tag = int(got.delivery.delivery_tag or 0)  # type: ignore[union-attr]
                mid = props.message_id or self._new_id()
                attrs = attributes_of(dict(props.headers or {}), mid, self._level_queues)
                target = to or attrs.get("fairq.source")
                if target is not None and target != queue:
                    try:
                        await self._config(target)
                    except QueueNotFound:
                        target = None
                else:
                    target = None
                if target is None:
                    item = ("", queue, got.body, dict(attrs), props.priority or 0, mid)
                    kept += 1
                else:
                    fresh = redrive_attributes(attrs)
                    item = ("", target, got.body, dict(fresh), props.priority or 0, self._new_id())
                (took,) = await self._publish([item], f"redriving {queue!r}")
                with driver_errors(f"redriving {queue!r}", self.url.masked):
                    if took:
                        await ch.basic_ack(tag)
                    else:
                        await ch.basic_nack(tag, requeue=True)
                if took and target is not None:
                    self._count(target, "sent")
                    self.wakeups.notify([target])
                    moved += 1
        finally:
            self.link.forget(f"redrive:{queue}")
            with contextlib.suppress(Exception):
                await ch.close()
        self.wakeups.notify([queue])
        return moved
