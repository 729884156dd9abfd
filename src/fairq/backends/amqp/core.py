"""The part of the RabbitMQ backend every other part uses: the connection and its channels,
the queues' options (cached from the store), counters (flushed to the store), ids, and
publishing with confirms (directly, or into the delay wheel)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Iterable
from typing import Any

from ...clock import Clock
from ...errors import ConnectionError, QueueNotFound
from ...message import format_id, next_id_base
from ...model.queues import QueueConfig
from .. import heaps
from ..base import Backend
from . import topology
from .feeds import Feed, Lease
from .link import AmqpUrl, DeliveryError, Link, driver_errors, spec
from .management import Management

__all__ = ["AmqpCore"]

log = logging.getLogger("fairq.amqp")

_CONFIG_TTL = 2.0  # seconds a queue's options are cached (other processes' changes show then)
_FLUSH_EVERY = 0.5  # seconds between writes of the counters to the store


class AmqpCore(Backend):
    """The connection, options, counters and publishing every part of the backend uses."""

    poll_interval = 5.0  # deliveries are pushed: the pulse only wakes waiters for lease ends

    def __init__(self, url: AmqpUrl, clock: Clock, store: Backend) -> None:
        super().__init__(clock)
        self.url = url
        self.store = store
        self.link = Link(url)
        self.link.on_reconnect.append(self._reconnected)
        self._configs: dict[str, tuple[QueueConfig, float]] = {}
        self._feeds: dict[str, Feed] = {}
        #: the most deliveries this process's consumer of a queue may hold, when a worker
        #: said how many it can run (``consumer_window``); else the URL's ``prefetch``
        self._windows: dict[str, int] = {}
        self._leases: dict[str, Lease] = {}
        # (deadline, receipt) of each lease; stale ones go at the top or on compaction
        self._deadlines: list[tuple[float, str]] = []
        self._deadlines_limit = heaps.COMPACT_MIN  # (heaps.push)
        # expired leases whose give-back failed (the store away): tried again until it works
        self._returns: list[Lease] = []
        self._returns_failing = False  # said once per outage
        self._counts: dict[str, dict[str, int]] = {}
        self._bound: set[str] = set()  # queues bound on fairq/due in this process
        self._wheels: set[str] = set()  # delay wheels declared on this connection
        self._durable_ok: bool | None = None  # this broker runs the durable wheel (None: ask)
        self._wheel_lock = asyncio.Lock()
        self._level_queues = topology.hop_queues()
        self._last_id = 0
        self._tag = int.from_bytes(os.urandom(4), "big") | 1
        self._seq = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        self._kick = asyncio.Event()
        self._idle_check = False  # a look for idle consumers is due (leases.FEED_IDLE)
        self._closed = False
        self._management: Management | None = None
        if url.management is not None:
            self._management = Management(url.management, url.user, url.password, timeout=2.0)

    def _check_open(self) -> None:
        if self._closed:
            raise ConnectionError(f"the broker on {self.url.masked!r} is closed")

    def _reconnected(self) -> None:
        """A new connection: every lease and held delivery of the old one is gone (the broker
        returned them to their queues); waiters try again."""
        self._leases.clear()
        self._deadlines.clear()
        self._returns.clear()
        for feed in self._feeds.values():
            feed.held.clear()
            feed.leases = 0
        self._bound.clear()
        self._wheels.clear()
        self._durable_ok = None  # the broker may have been upgraded meanwhile
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
        failing = False  # said once per outage of the store
        while True:
            await asyncio.sleep(_FLUSH_EVERY)
            if self._counts:
                try:
                    await self._flush_counts()
                except ConnectionError as exc:
                    if not failing:
                        log.warning(
                            "could not write queue counters to the store (%s); they are kept "
                            "and written when it answers again",
                            exc,
                        )
                    failing = True
                except Exception:
                    log.warning("could not write queue counters to the store", exc_info=True)
                else:
                    if failing:
                        log.info("queue counters are written to the store again")
                    failing = False

    # -- options ---------------------------------------------------------------------------
    async def _config(self, name: str) -> QueueConfig:
        self._check_open()
        hit = self._configs.get(name)
        now = time.monotonic()
        if hit is not None and now - hit[1] < _CONFIG_TTL:
            return hit[0]
        try:
            config = await self.store.queue_config(name)  # QueueNotFound
        except ConnectionError:
            if hit is None:
                raise
            # the store is away: the configuration last read, so that acks, nacks and
            # expired leases, which RabbitMQ alone settles, go on meanwhile
            return hit[0]
        self._configs[name] = (config, now)
        return config

    async def _bind_due(self, name: str, config: QueueConfig) -> None:
        """Bind the queue where delays end: on ``fairq/due`` (the classic wheel's end), and on
        ``fairq/due/durable`` unless it may refuse a message (``topology.wheel_for``). A name
        too long for a routing key has no delays."""
        pattern = topology.due_pattern(name)
        if len(pattern) <= topology.ROUTING_KEY_MAX:
            admin = await self.link.channel("admin")
            with driver_errors(f"binding queue {name!r}", self.url.masked):
                await admin.queue_bind(name, topology.DUE, routing_key=pattern)
                if topology.wheel_for(config) == topology.DURABLE:
                    await admin.queue_bind(name, topology.DUE_DURABLE, routing_key=pattern)
        self._bound.add(name)

    async def _classic(self, name: str) -> bool:
        """Whether queue ``name`` is a classic queue whatever its options (an attention
        work queue, ``attention.py``); else its options decide (``topology.quorum``)."""
        return False

    # -- sending ---------------------------------------------------------------------------
    def _new_id(self) -> str:
        self._last_id = next_id_base(self._last_id, self.clock.now())
        return format_id(self._last_id)

    def _durable_wheel(self) -> bool:
        """Whether the broker runs the durable wheel: quorum queues with a message TTL and
        at-least-once dead-lettering came with RabbitMQ 3.10; before, every delay takes
        the classic wheel (at most once per hop), as it did in fairq's earlier versions.
        Asked once per connection."""
        if self._durable_ok is None:
            version = self.link.server_version()
            self._durable_ok = version is None or version >= topology.DURABLE_SINCE
            if not self._durable_ok:
                log.warning(
                    "RabbitMQ %s predates at-least-once dead-lettering (3.10): delayed "
                    "messages take the classic wheel, which a broker crash mid-hop can lose",
                    ".".join(map(str, version or ())),
                )
        return self._durable_ok

    async def _ensure_wheel(self, kind: str) -> None:
        if kind in self._wheels:
            return
        async with self._wheel_lock:
            if kind in self._wheels:
                return
            admin = await self.link.channel("admin")
            with driver_errors("declaring the delay queues", self.url.masked):
                levels = topology.wheel(kind)
                for exchange, _, _, _ in levels:
                    await admin.exchange_declare(exchange, exchange_type="topic", durable=True)
                if kind == topology.DURABLE:
                    await admin.queue_declare(
                        topology.VOID, durable=True, arguments=topology.VOID_ARGUMENTS
                    )
                    await admin.queue_bind(topology.VOID, topology.DUE_DURABLE, routing_key="#")
                for exchange, queue, args, bindings in levels:
                    await admin.queue_declare(queue, durable=True, arguments=args)
                    for what, dest, pattern in bindings:
                        if what == "queue":
                            await admin.queue_bind(dest, exchange, routing_key=pattern)
                        else:
                            await admin.exchange_bind(dest, exchange, routing_key=pattern)
            self._wheels.add(kind)

    async def _publish(
        self,
        items: Iterable[tuple[str, str, bytes, dict[str, Any], int, str]],
        what: str,
    ) -> list[bool]:
        """Publish (exchange, routing key, body, headers, priority, id) items persistently and
        wait for every confirm; True per item the broker took, False per one it refused."""
        ch = await self.link.channel("publish", confirms=True)
        props = spec.Basic.Properties
        messages = [
            (
                body,
                exchange,
                key,
                props(
                    delivery_mode=2,
                    message_id=mid,
                    headers=headers or None,
                    priority=priority or None,
                ),
            )
            for exchange, key, body, headers, priority, mid in items
        ]
        for _, _, _, properties in messages:  # before any is sent: all or nothing
            if properties.headers:
                self.link.check_header(properties, what)
        with driver_errors(what, self.url.masked):
            confirms = await asyncio.gather(
                *[
                    ch.basic_publish(body, exchange=exchange, routing_key=key, properties=p)
                    for body, exchange, key, p in messages
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
            try:
                kind = topology.wheel_for(await self._config(queue))
            except QueueNotFound:  # deleted meanwhile: its delay ends in fairq/due/void
                kind = topology.DURABLE
            if kind == topology.DURABLE and not self._durable_wheel():
                kind = topology.CLASSIC
            await self._ensure_wheel(kind)
            route = topology.delay_route(delay, queue, kind)
            if queue not in self._bound:  # a queue declared elsewhere, or by an older fairq
                with contextlib.suppress(QueueNotFound):
                    # the store's options, not a cached copy: they decide the bindings
                    await self._bind_due(queue, await self.store.queue_config(queue))
            return route
        return "", queue
