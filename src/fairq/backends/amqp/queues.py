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
import time
from typing import Any

from ...errors import (
    BATCH_LARGER,
    ConfigConflict,
    InvalidName,
    QueueFull,
    QueueNotFound,
    Unsupported,
)
from ...message import Received, id_time, parse_id
from ...model.queues import QUEUE_COUNTERS, Envelope, QueueConfig, QueueStats
from ..rules import check_priorities, plan_dedup, redrive_attributes
from . import topology
from .feeds import Delivered
from .headers import GROUP, attributes_of
from .leases import AmqpLeases, log
from .link import driver_errors, spec

#: seconds a delete of a queue others consume waits before it returns (``delete_queue``)
_DELETE_SETTLE = 0.2

__all__ = ["AmqpQueues"]


class AmqpQueues(AmqpLeases):
    """Queues on RabbitMQ; the store keeps the options, counters and dedup records."""

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:
        await self.link.open()
        admin = await self.link.channel("admin")
        with driver_errors("declaring fairq's exchanges", self.url.masked):
            await admin.exchange_declare(topology.DLX, exchange_type="direct", durable=True)
            await admin.exchange_declare(topology.DUE, exchange_type="topic", durable=True)
            await admin.exchange_declare(topology.DUE_DURABLE, exchange_type="topic", durable=True)
        await self.link.channel("publish", confirms=True)
        self._tasks.append(asyncio.create_task(self._lease_timer(), name="fairq-amqp-leases"))
        self._tasks.append(asyncio.create_task(self._flusher(), name="fairq-amqp-counts"))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for feed in self._feeds.values():  # before anything yields to the ack sender
            if feed.consume:
                feed.hold_acks()
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

    async def _declare_rabbit(self, name: str, config: QueueConfig, classic: bool) -> None:
        args = topology.queue_arguments(name, config, classic)
        admin = await self.link.channel("admin")
        try:
            with driver_errors(f"declaring queue {name!r}", self.url.masked):
                await admin.queue_declare(name, durable=True, arguments=args)
        except ConfigConflict as exc:
            raise ConfigConflict(
                f"queue {name!r} exists in RabbitMQ with other arguments than fairq's "
                f"(wanted {args}): {exc}"
            ) from exc
        await self._bind_due(name, config)

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
        classic = await self._classic(name)
        if name.startswith(topology.RESERVED):
            raise InvalidName(
                f"queue {name!r}: names starting with {topology.RESERVED!r} are fairq's own on "
                "RabbitMQ (the store's tickets of attention work queues)"
            )
        try:
            old: QueueConfig | None = await self.store.queue_config(name)
        except QueueNotFound:
            old = None
        if old is not None:
            old.check_change(name, config)
            before = topology.queue_arguments(name, old, classic)
            if before != topology.queue_arguments(name, config, classic):
                raise Unsupported(
                    f"queue {name!r}: retention, max_length and overflow are RabbitMQ queue "
                    "arguments, fixed when the queue is declared; delete the queue and declare "
                    "it again (capability 'queues.change_arguments')"
                )
        await self._declare_rabbit(name, config, classic)
        dlq = config.dead_letter
        if dlq is not None:
            try:
                await self.store.queue_config(dlq)
            except QueueNotFound:
                await self._declare_rabbit(dlq, QueueConfig.for_dead_letters(), classic)
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
        consumers = 0
        with contextlib.suppress(QueueNotFound):  # (gone already: the delete is a no-op)
            admin = await self.link.channel("admin")
            with driver_errors(f"reading queue {name!r}", self.url.masked):
                ok = await admin.queue_declare(name, passive=True)
                consumers = int(ok.consumer_count or 0)
        admin = await self.link.channel("admin")
        with driver_errors(f"deleting queue {name!r}", self.url.masked):
            await admin.queue_delete(name)
        if consumers:
            # RabbitMQ 3.10 answers a quorum queue's delete before the queue has stopped
            # when another process consumes it; a queue declared again under the same name
            # meanwhile (within ~50 ms) is broken and loses what it is sent. A delete that
            # returns a moment later keeps this process's own delete-then-declare safe.
            await asyncio.sleep(_DELETE_SETTLE)
        with contextlib.suppress(Exception):
            await self.store.drop_counts(f"queue:{name}")
        self._counts.pop(name, None)
        self.wakeups.notify([name])
        return existed

    async def list_queues(self, prefix: str = "") -> list[str]:
        self._check_open()
        return await self.store.list_queues(prefix)

    async def ping(self) -> None:
        """The store, and RabbitMQ itself (a passive declare of ``amq.direct``, which every
        vhost has): listing the queues asks only the store."""
        await self.store.ping()
        # a channel of its own: a health check cut off by its timeout closes the channel
        # it was on, and other calls must not share that fate
        health = await self.link.channel("health")
        with driver_errors("checking the broker", self.url.masked):
            await health.exchange_declare("amq.direct", exchange_type="direct", passive=True)

    async def _store_copies(
        self, queue: str, config: QueueConfig, envelopes: list[Envelope], ids: list[str]
    ) -> None:
        """Publish new messages to ``queue``; ``QueueFull`` if a bounded queue refused any."""
        took = await self._publish_new(queue, envelopes, ids)
        self._check_took(queue, config, took)

    async def _publish_new(
        self, queue: str, envelopes: list[Envelope], ids: list[str]
    ) -> list[bool]:
        """Publish new messages to ``queue`` (counted ``sent``); which ones it took."""
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
        return took

    def _check_took(self, queue: str, config: QueueConfig, took: list[bool]) -> None:
        """``QueueFull`` if RabbitMQ refused any of a send's messages."""
        stored = sum(took)
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
            raise QueueFull(queue, config.max_length, BATCH_LARGER)
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
                feed.ack(feed.held.popleft().delivery.delivery_tag)
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
        moved = copied = 0
        arrived: dict[str, int] = {}

        async def move(got: Delivered) -> bool:
            """Publish ``got`` to its target (to, else its source), or a copy of it back to
            ``queue``'s tail when it has none; whether that publish was taken."""
            nonlocal moved, copied
            props = got.header.properties
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
            else:
                fresh = redrive_attributes(attrs)
                item = ("", target, got.body, dict(fresh), props.priority or 0, self._new_id())
            (took,) = await self._publish([item], f"redriving {queue!r}")
            if took and target is not None:
                self._count(target, "sent")
                self.wakeups.notify([target])
                arrived[target] = arrived.get(target, 0) + 1
                moved += 1
            elif took:
                copied += 1
            return bool(took)

        # first what this process's consumer of the queue holds (delivered to it, so in no
        # other channel's basic.get: a dead letter received and nacked here comes back to
        # it): the consumer is cancelled, so everything on its way to it has arrived
        # (stop() waits for cancel-ok) and nothing more comes while the redrive runs —
        # not the copies it puts at the queue's tail either
        feed = self._feeds.get(queue)
        held: list[Delivered] = []
        stopped = feed is not None and feed.consume and feed.live()
        if stopped:
            assert feed is not None
            await feed.settled()  # what was nacked back here has come back (as stats waits)
            held = await feed.stop()
            generation = feed.generation
        try:
            while held and (limit is None or moved < limit):
                took = await move(held[0])
                got = held.pop(0)
                assert feed is not None
                if feed.live() and feed.generation == generation:  # else it went back
                    tag = int(got.delivery.delivery_tag)
                    if took:
                        feed.ack(tag)
                    else:
                        feed.give_back(feed.channel, tag)  # type: ignore[arg-type]
            with driver_errors(f"redriving {queue!r}", self.url.masked):
                ok = await ch.queue_declare(queue, passive=True)
            # one pass over what is there now (not the copies just put at its tail); what
            # stays goes back as a copy at the tail
            for _ in range(int(ok.message_count or 0) - copied):
                if limit is not None and moved >= limit:
                    break
                with driver_errors(f"redriving {queue!r}", self.url.masked):
                    got = await ch.basic_get(queue, no_ack=False)
                if isinstance(got.delivery, spec.Basic.GetEmpty):
                    break
                tag = int(got.delivery.delivery_tag or 0)  # type: ignore[union-attr]
                took = await move(got)
                with driver_errors(f"redriving {queue!r}", self.url.masked):
                    if took:
                        await ch.basic_ack(tag)
                    else:
                        await ch.basic_nack(tag, requeue=True)
        finally:
            if stopped:
                assert feed is not None
                if feed.live() and feed.generation == generation:
                    for got in held:  # past the limit, or a move failed: back they go
                        feed.give_back(feed.channel, int(got.delivery.delivery_tag))  # type: ignore[arg-type]
                with contextlib.suppress(Exception):
                    await feed.start()  # consuming again
            self.link.forget(f"redrive:{queue}")
            with contextlib.suppress(Exception):
                await ch.close()
            if arrived:
                await self._redriven(arrived)
        self.wakeups.notify([queue])
        return moved

    async def _redriven(self, arrived: dict[str, int]) -> None:
        """Hook: a redrive brought ``arrived[q]`` messages into queue ``q``."""
