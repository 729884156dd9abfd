"""Publish/subscribe: topics, durable subscriptions, and ephemeral listeners.

A topic copies every message it publishes into each subscription whose filter policy
(Amazon SNS style, :mod:`fairq.filters`) and routing pattern (AMQP topic exchange,
:mod:`fairq.routing`) match. A subscription IS a queue, named ``<topic>.<subscription>``:
consumers compete inside it, and leases, retries, dead letters and stats all apply.
The copies of one publish are stored in one atomic backend step: all or none.

``Topic.listen()`` is the ephemeral kind: it gets what is published while it listens,
nothing is stored for it, and a slow listener loses the oldest messages past its buffer.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Hashable, Iterable, Mapping, Sequence
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .errors import ConfigConflict, InvalidOption, TopicNotFound
from .filters import compile_filter
from .message import Outgoing, Received, check_name, id_time, parse_id, shown
from .model.topics import (
    PublishResult,
    Subscription,
    SubscriptionIndex,
    TopicConfig,
    TopicStats,
    check_subscription,
)
from .queue import Envelope, Queue, make_envelopes, wait_for_room
from .routing import check_pattern, topic_matches

if TYPE_CHECKING:
    from .backends.base import Backend

__all__ = [
    "Listener",
    "PublishResult",
    "Subscription",
    "SubscriptionIndex",
    "Topic",
    "TopicConfig",
    "TopicStats",
]

DEFAULT_LISTEN_BUFFER = 1000


# -- ephemeral listeners -------------------------------------------------------------------
async def next_within(listener: AsyncIterator[Received], timeout: float | None) -> Received | None:
    """A listener's next message, or None after ``timeout`` seconds or once it has ended
    (``get`` of :class:`Listener` and of the HTTP client's listener)."""
    try:
        async with asyncio.timeout(timeout):
            return await anext(listener)
    except (TimeoutError, StopAsyncIteration):
        return None


class Listener:
    """An ephemeral, at-most-once subscription: an async iterator of what is published to
    its topic while it listens. Nothing is stored for it; when it falls more than
    ``buffer`` messages behind, the oldest are dropped and counted in ``dropped``."""

    def __init__(
        self,
        hub: _Hub,
        backend: Backend,
        topic: str,
        routing: str | None,
        filter: Mapping[str, Any] | None,
        buffer: int,
    ) -> None:
        if routing is not None:
            check_pattern(routing)
        if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1:
            raise InvalidOption(f"buffer must be a positive integer, got {buffer!r}")
        self.topic = topic
        self.routing = routing
        self._filter = compile_filter(filter)
        self._buffer: deque[Received] = deque()
        self._limit = buffer
        self._ready = asyncio.Event()
        self._hub = hub
        self._backend = backend
        self._closed = False
        self.received = 0
        self.dropped = 0
        self._known = False  # the topic was found to exist (at the first wait)
        if hub.add(self):
            backend.attach_listeners(topic, partial(hub.deliver_once, topic))

    def _offer(self, routing_key: str, message: Received) -> None:
        if self._closed:
            return
        if self.routing is not None and not topic_matches(self.routing, routing_key):
            return
        if not self._filter.matches(message.attributes):
            return
        if len(self._buffer) >= self._limit:
            self._buffer.popleft()
            self.dropped += 1
        self._buffer.append(message)
        self._ready.set()

    def __aiter__(self) -> AsyncIterator[Received]:
        return self

    async def _check_topic(self) -> None:
        """``TopicNotFound`` for a topic that does not exist (else it would wait for ever),
        as the server's stream does; asked once."""
        if not self._known:
            await self._backend.topic_config(self.topic)
            self._known = True

    async def __anext__(self) -> Received:
        if not self._known and not self._buffer:
            await self._check_topic()
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()
        self.received += 1
        return self._buffer.popleft()

    async def get(self, timeout: float | None = None) -> Received | None:
        """The next message, or None after ``timeout`` seconds (or once closed)."""
        return await next_within(self, timeout)

    async def close(self) -> None:
        """Stop listening; iteration ends once the buffer is drained."""
        if self._closed:
            return
        self._closed = True
        if self._hub.remove(self):
            self._backend.attach_listeners(self.topic, None)
        self._ready.set()

    async def __aenter__(self) -> Listener:
        await self._check_topic()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class _Hub:
    """The listeners of one store within this process."""

    def __init__(self) -> None:
        self.by_topic: dict[str, weakref.WeakSet[Listener]] = {}
        self._seen: deque[str] = deque(maxlen=4096)  # publications delivered lately
        self._seen_set: set[str] = set()

    def deliver_once(self, topic: str, items: Sequence[tuple[Envelope, str]]) -> None:
        """Deliver each publication once: this process's own publish delivers at once, and
        an engine may carry the same publication back (PostgreSQL's NOTIFY reaches every
        broker, this one's too); a publish in a caller's transaction arrives only that way,
        at its commit."""
        fresh = []
        for env, message_id in items:
            if message_id in self._seen_set:
                continue
            if len(self._seen) == self._seen.maxlen:
                self._seen_set.discard(self._seen[0])
            self._seen.append(message_id)
            self._seen_set.add(message_id)
            fresh.append((env, message_id))
        if fresh:
            self.deliver(topic, fresh)

    def add(self, listener: Listener) -> bool:
        """Add a listener; True if it is the first of its topic."""
        listeners = self.by_topic.setdefault(listener.topic, weakref.WeakSet())
        first = not listeners
        listeners.add(listener)
        return first

    def remove(self, listener: Listener) -> bool:
        """Remove a listener; True if it was the last of its topic."""
        listeners = self.by_topic.get(listener.topic)
        if listeners is None:
            return False
        had = listener in listeners
        listeners.discard(listener)
        return had and not listeners

    def deliver(self, topic: str, items: Sequence[tuple[Envelope, str]]) -> None:
        listeners = self.by_topic.get(topic)
        if not listeners:
            return
        for env, message_id in items:
            # as a subscription's copy reads: its one delivery, sent when the id says, the
            # routing key among the attributes
            try:
                sent_at = id_time(parse_id(message_id))
            except ValueError:  # an engine's own id (RabbitMQ's): the time it reached us
                sent_at = time.time()
            attrs = dict(env.attributes)
            if env.routing_key:
                attrs["fairq.routing_key"] = env.routing_key
            for listener in list(listeners):
                message = Received(
                    message_id,
                    env.body,
                    dict(attrs),
                    1,
                    sent_at,
                    env.priority,
                    env.group,
                    "",
                    topic,
                )
                listener._offer(env.routing_key, message)


_HUBS: dict[Hashable, _Hub] = {}


def hub_for(backend: Backend) -> _Hub:
    """The listener hub shared by every broker of this process on the same store."""
    scope = backend.listen_scope()
    hub = _HUBS.get(scope)
    if hub is None:
        hub = _HUBS[scope] = _Hub()
    return hub


# -- the handle ----------------------------------------------------------------------------
class Topic:
    """A handle to one topic; ``broker.topic(name)`` makes one without a round trip."""

    __slots__ = ("_backend", "_max_bytes", "name")

    def __init__(self, backend: Backend, name: str, max_message_bytes: int) -> None:
        self.name = check_name(name, "topic")
        self._backend = backend
        self._max_bytes = max_message_bytes

    def __repr__(self) -> str:
        return f"Topic({self.name!r})"

    async def subscribe(
        self,
        name: str,
        filter: Mapping[str, Any] | None = None,
        routing: str | None = None,
        push: str | None = None,
        **queue_options: Any,
    ) -> Queue:
        """Create (or update) subscription ``name``; return its queue ``<topic>.<name>``.

        ``filter`` is an SNS-style attribute filter policy, ``routing`` an AMQP topic
        pattern (``order.*.br``, ``order.#``; an exact key is direct routing); with
        neither, every message is copied (fanout). ``push`` makes the worker runtime POST
        each message to that URL instead of waiting for pulls. ``queue_options`` are those
        of ``declare_queue`` (visibility_timeout, max_attempts, dead_letter, ...). The
        subscription sees only messages published after it was created.
        """
        sub = check_subscription(self.name, name, filter, routing, push)
        from .model.queues import queue_config_from_options

        config = queue_config_from_options(sub.queue, queue_options)
        if config.dead_letter is not None and config.dead_letter.startswith(self.name + "."):
            try:
                others = await self._backend.subscriptions(self.name)
            except TopicNotFound:
                others = []
            for other in others:
                if other.name != name and other.queue == config.dead_letter:
                    raise ConfigConflict(
                        f"the dead-letter queue {shown(config.dead_letter)} of subscription "
                        f"{shown(name)} is subscription {shown(other.name)}'s queue: choose "
                        "another dead_letter= or another subscription name"
                    )
        await self._backend.subscribe(sub, config)
        return Queue(self._backend, sub.queue, self._max_bytes)

    async def unsubscribe(self, name: str) -> bool:
        """Remove a subscription and delete its queue; False if there was none."""
        check_name(name, "subscription")
        return await self._backend.unsubscribe(self.name, name)

    async def subscriptions(self) -> list[Subscription]:
        """The topic's subscriptions, sorted by name."""
        return await self._backend.subscriptions(self.name)

    async def publish(
        self,
        body: object,
        attributes: Mapping[str, str] | None = None,
        routing_key: str = "",
        dedup_id: str | None = None,
        delay: float = 0.0,
        timeout: float | None = None,
        connection: object | None = None,
    ) -> PublishResult:
        """Copy a message into every matching subscription, atomically (all or none).

        A repeated ``dedup_id`` within the topic's ``dedup_window`` publishes nothing and
        returns the first result. ``timeout`` bounds the wait when a subscription queue is
        full with ``overflow="block"``. ``connection`` (PostgreSQL): publish inside the
        caller's transaction, as ``Queue.send`` does (the outbox).
        """
        (result,) = await self.publish_batch(
            [Outgoing(body, attributes, delay=delay, dedup_id=dedup_id, routing_key=routing_key)],
            timeout=timeout,
            connection=connection,
        )
        return result

    async def publish_batch(
        self,
        messages: Iterable[Outgoing],
        timeout: float | None = None,
        connection: object | None = None,
    ) -> list[PublishResult]:
        """Publish many messages in one atomic step (each ``Outgoing`` may carry its own
        ``routing_key``); return one result per message."""
        envs = make_envelopes(messages, self._max_bytes, "publish_batch", topic=True)
        if not envs:
            return []
        backend = self._backend
        if connection is not None:
            # the caller's transaction: listeners hear of it once it commits (by the engine)
            return await wait_for_room(
                backend, None, timeout, lambda: backend.publish_in(connection, self.name, envs)
            )
        results = await wait_for_room(
            backend, None, timeout, lambda: backend.publish(self.name, envs)
        )
        if _HUBS:
            hub = _HUBS.get(backend.listen_scope())
            if hub is not None and hub.by_topic.get(self.name):
                hub.deliver_once(
                    self.name,
                    [
                        (e, r.message_id)
                        for e, r in zip(envs, results, strict=True)
                        if not r.duplicate
                    ],
                )
        return results

    def listen(
        self,
        routing: str | None = None,
        filter: Mapping[str, Any] | None = None,
        buffer: int = DEFAULT_LISTEN_BUFFER,
    ) -> Listener:
        """Listen to what is published to this topic from now on (this process on memory
        and SQLite, across processes through the server's stream endpoint; every process
        sharing the store on Redis and PostgreSQL).

        ``async for msg in topic.listen(): ...`` — at-most-once, nothing stored.
        """
        return Listener(hub_for(self._backend), self._backend, self.name, routing, filter, buffer)

    async def stats(self) -> TopicStats:
        """The topic's counters."""
        return await self._backend.topic_stats(self.name)

    async def config(self) -> TopicConfig:
        """The options the topic is declared with."""
        return await self._backend.topic_config(self.name)
