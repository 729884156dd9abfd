"""``fairq.connect()``: parse a URL, open the backend it names, hand out handles.

    broker = await fairq.connect("sqlite:///fairq.db")
    q = await broker.declare_queue("ticket-pdf")

URL schemes: ``memory://``, ``sqlite:///relative.db`` / ``sqlite:////absolute.db``
(query options ``synchronous=normal|full``, ``busy_timeout=<seconds>``),
``redis://[user:password@]host:port/db``, ``rediss://`` (TLS), ``redis+cluster://host:port``
(options in ``fairq.backends.redis.conn.parse_url``);
``postgresql://user:pass@host:port/db?schema=fairq`` (see ``backends/postgres``);
``amqp://user:pass@host:port/vhost?store=<url>`` (RabbitMQ, see docs/rabbitmq.md).
``fairq.backends.open`` maps schemes to backends.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from .attention import Attention, AttentionConfig, Plan
from .backends.base import Backend
from .backends.open import mask_url, open_backend
from .clock import Clock, SystemClock
from .errors import ConnectionError, InvalidOption, Unsupported
from .idempotency import IdempotencyStore, VersionGate
from .message import check_name
from .model.attention import DEFAULT_PLANS, Charge, default_work_queue
from .model.queues import DEFAULT, queue_config_from_options
from .pubsub import Topic, TopicConfig
from .queue import Overflow, Queue
from .waitingroom import WaitingRoom, declare_room, open_room

__all__ = ["DEFAULT_URL", "Broker", "connect", "mask_url"]

DEFAULT_URL = "sqlite:///fairq.db"
DEFAULT_MAX_MESSAGE_BYTES = 262_144


async def connect(
    url: str | None = None,
    *,
    clock: Clock | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> Broker:
    """Open a broker. ``url=None`` takes ``$FAIRQ_URL``, else ``sqlite:///fairq.db``.

    Raises ``fairq.ConnectionError`` (URL with password masked, the cause chained) when
    the scheme is unknown or the backend cannot be reached.
    """
    if url is None:
        url = os.environ.get("FAIRQ_URL") or DEFAULT_URL
    if not isinstance(url, str):
        raise ConnectionError(f"url must be a string, got {url!r}")
    if (
        isinstance(max_message_bytes, bool)
        or not isinstance(max_message_bytes, int)
        or (max_message_bytes < 1)
    ):
        raise InvalidOption(
            f"max_message_bytes must be a positive integer, got {max_message_bytes!r}"
        )
    backend = open_backend(url, clock or SystemClock())
    await backend.open()
    return Broker(backend, url, max_message_bytes)


def _prefix(prefix: object) -> bool:
    """Check a listing's ``prefix``; False when no name can start with it (names never hold
    NUL, which PostgreSQL's text refuses: the listing is empty on every engine)."""
    if not isinstance(prefix, str):
        raise InvalidOption(f"prefix must be a string, got {prefix!r}")
    return "\x00" not in prefix


class Broker:
    """A connection to one backend; hands out :class:`~fairq.queue.Queue` handles.

    Use it as ``async with await fairq.connect(url) as broker:`` or call :meth:`close`.
    """

    def __init__(self, backend: Backend, url: str, max_message_bytes: int) -> None:
        self.backend = backend
        self.url = mask_url(url)
        self.max_message_bytes = max_message_bytes
        self._closed = False

    def __repr__(self) -> str:
        return f"Broker({self.url!r})"

    async def __aenter__(self) -> Broker:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the backend (idempotent)."""
        if not self._closed:
            self._closed = True
            await self.backend.close()

    @property
    def clock(self) -> Clock:
        return self.backend.clock

    # -- queues ----------------------------------------------------------------------------
    async def declare_queue(
        self,
        name: str,
        *,
        visibility_timeout: float = 30.0,
        max_attempts: int | None = 5,
        dead_letter: str | None = DEFAULT,
        retention: float = 1_209_600.0,
        max_length: int | None = None,
        overflow: Overflow = "reject",
        fifo: bool = False,
        max_priority: int = 0,
        dedup_window: float = 300.0,
        freshness_slo: float | None = None,
    ) -> Queue:
        """Create a queue, or update the options of an existing one; return its handle.

        ``dead_letter`` defaults to ``"<name>.dlq"`` (declared automatically, with no
        dead-letter queue and no attempt limit of its own); ``None`` discards instead.
        ``fifo`` and ``max_priority`` cannot change once declared (``ConfigConflict``).
        """
        config = queue_config_from_options(
            name,
            {
                "visibility_timeout": visibility_timeout,
                "max_attempts": max_attempts,
                "dead_letter": dead_letter,
                "retention": retention,
                "max_length": max_length,
                "overflow": overflow,
                "fifo": fifo,
                "max_priority": max_priority,
                "dedup_window": dedup_window,
                "freshness_slo": freshness_slo,
            },
        )
        await self.backend.declare_queue(name, config)
        return self.queue(name)

    def queue(self, name: str) -> Queue:
        """A handle to an existing queue (``QueueNotFound`` at first use if it is not)."""
        return Queue(self.backend, name, self.max_message_bytes)

    async def delete_queue(self, name: str) -> bool:
        """Delete a queue and all its messages; False if there was none."""
        return await self.backend.delete_queue(check_name(name))

    async def list_queues(self, prefix: str = "") -> list[str]:
        """Names of the queues that start with ``prefix``, sorted."""
        if not _prefix(prefix):
            return []
        return await self.backend.list_queues(prefix)

    async def redrive(self, queue: str, to: str | None = None, limit: int | None = None) -> int:
        """Move messages out of a dead-letter queue, oldest first; return how many moved.

        ``to=None`` sends each back to the queue it came from (attribute ``fairq.source``);
        messages whose source queue no longer exists stay. Redriven messages start again
        at attempt 0 and drop the ``fairq.reason``/``source``/``attempts`` attributes.
        """
        check_name(queue)
        if to is not None:
            check_name(to)
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 0
        ):
            raise InvalidOption(f"limit must be a non-negative integer or None, got {limit!r}")
        return await self.backend.redrive(queue, to, limit)

    # -- attention -------------------------------------------------------------------------
    async def declare_attention(
        self,
        domain: str,
        *,
        plans: Mapping[str, Plan] | None = None,
        default_plan: str = "basic",
        work_queue: str | None = None,
        queue_options: Mapping[str, Any] | None = None,
        slice_lease: float = 30.0,
        charge: Charge = "time",
        shards: int = 1,
    ) -> Attention:
        """Create an attention domain (or update its options); return its handle.

        ``plans`` name the consumption policies keys can be on (default: basic, pro,
        enterprise as in the seed), ``work_queue`` is the template of each key's queue,
        ``queue_options`` the ``declare_queue`` options of every work queue, and
        ``slice_lease`` how long a slice's concurrency token lives unless renewed.
        ``charge`` is what tenants share: ``"time"`` (default; a slice costs the seconds
        it holds a worker) or ``"messages"`` (the messages it handles), each over the
        plan's ``weight``. ``shards`` splits the domain into that many shards, each key in
        the one ``shard_of(key, shards)`` names (a stable hash): on Redis Cluster each
        shard is a slot of its own, so a big domain spreads over the nodes (docs/redis.md);
        elsewhere only the queue names show it. ``work_queue`` defaults to
        ``"process.{domain}.{key}.work"``, or ``"{domain}-{shard}.{key}.work"`` with more
        than one shard. ``work_queue`` and ``shards`` cannot change once the domain has keys
        (``ConfigConflict``: their backlog is in the queues the old template named).
        """
        check_name(domain, "attention domain")
        config = AttentionConfig(
            plans=dict(plans) if plans is not None else dict(DEFAULT_PLANS),
            default_plan=default_plan,
            work_queue=default_work_queue(shards) if work_queue is None else work_queue,
            queue_options=dict(queue_options or {}),
            slice_lease=slice_lease,
            charge=charge,
            shards=shards,
        ).validated(domain)
        lacking = self.backend.missing.get("worker_time_fairness")
        if lacking is not None and config.uses_worker_time_fairness():
            raise Unsupported(
                f"plan weights and charge='messages' need the worker-time scheduler, which "
                f"{type(self.backend).__name__} does not have yet: {lacking}"
            )
        await self.backend.declare_attention(domain, config)
        return self.attention(domain)

    def attention(self, domain: str) -> Attention:
        """A handle to an existing attention domain (``AttentionNotFound`` at first use)."""
        return Attention(self.backend, domain, self.max_message_bytes)

    async def list_attention(self, prefix: str = "") -> list[str]:
        """Names of the attention domains that start with ``prefix``, sorted."""
        if not _prefix(prefix):
            return []
        return await self.backend.list_attention(prefix)

    async def delete_attention(self, domain: str) -> bool:
        """Delete an attention domain's keys and signals (its work queues stay)."""
        return await self.backend.delete_attention(check_name(domain, "attention domain"))

    # -- topics ----------------------------------------------------------------------------
    async def declare_topic(self, name: str, *, dedup_window: float = 300.0) -> Topic:
        """Create a topic (or update its options); return its handle."""
        check_name(name, "topic")
        if (
            isinstance(dedup_window, bool)
            or not isinstance(dedup_window, int | float)
            or not (0 <= dedup_window < float("inf"))
        ):
            raise InvalidOption(f"dedup_window must be a number >= 0, got {dedup_window!r}")
        await self.backend.declare_topic(name, TopicConfig(float(dedup_window)))
        return self.topic(name)

    def topic(self, name: str) -> Topic:
        """A handle to an existing topic (``TopicNotFound`` at first use if it is not)."""
        return Topic(self.backend, name, self.max_message_bytes)

    async def delete_topic(self, name: str) -> bool:
        """Delete a topic, its subscriptions and their queues; False if there was none."""
        return await self.backend.delete_topic(check_name(name, "topic"))

    async def list_topics(self, prefix: str = "") -> list[str]:
        """Names of the topics that start with ``prefix``, sorted."""
        if not _prefix(prefix):
            return []
        return await self.backend.list_topics(prefix)

    # -- idempotency -----------------------------------------------------------------------
    def idempotency(self, namespace: str, ttl: float = 86_400.0) -> IdempotencyStore:
        """The idempotency keys of ``namespace`` (see :mod:`fairq.idempotency`); completed
        keys are kept, and never re-run, for ``ttl`` seconds."""
        return IdempotencyStore(self.backend, namespace, ttl)

    def versions(self, namespace: str) -> VersionGate:
        """The version gate of ``namespace``: the newest version seen per entity."""
        return VersionGate(self.backend, namespace)

    # -- waiting rooms ---------------------------------------------------------------------
    async def waiting_room(
        self,
        name: str,
        admit_rate: float = DEFAULT,
        token_ttl: float = DEFAULT,
        opens_at: float | None = DEFAULT,
        secret: bytes | None = None,
        *,
        max_active: int | None = DEFAULT,
    ) -> WaitingRoom:
        """Create a waiting room, or update the options given of an existing one; return
        its handle (see :mod:`fairq.waitingroom`).

        A new room takes ``admit_rate=500.0`` fans per second, ``token_ttl=600.0`` seconds,
        ``opens_at=None`` (open now; else seconds since the epoch: earlier fans are drawn
        into a random order at opening) and ``max_active=None`` (no cap on admitted fans
        holding live tokens) unless given; on an existing room, options not given keep
        their value. ``secret`` (32 bytes) seeds the room's signing key — pass the same one
        in every process; without it a key is generated once and kept in the backend.
        """
        given = {
            k: v
            for k, v in (
                ("admit_rate", admit_rate),
                ("token_ttl", token_ttl),
                ("opens_at", opens_at),
                ("max_active", max_active),
            )
            if v is not DEFAULT
        }
        return await declare_room(self.backend, name, given, secret)

    async def room(self, name: str, secret: bytes | None = None) -> WaitingRoom:
        """A handle to an existing waiting room (``fairq.RoomNotFound`` otherwise), with
        its options as stored; pass ``secret`` if the room was created with one."""
        return await open_room(self.backend, name, secret)

    async def list_rooms(self, prefix: str = "") -> list[str]:
        """Names of the waiting rooms that start with ``prefix``, sorted."""
        if not _prefix(prefix):
            return []
        return await self.backend.list_rooms(prefix)

    async def delete_room(self, name: str) -> bool:
        """Delete a waiting room, its fans and tokens; False if there was none."""
        return await self.backend.delete_room(check_name(name, "waiting room"))
