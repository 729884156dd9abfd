"""Queues: the options a queue is declared with, its statistics, and the :class:`Queue`
handle that validates and encodes what user code asks before the backend sees it.

The handle owns the waiting parts of the API — long polls (``receive(wait=...)``) and
sends that block on a full queue — as a loop of one atomic backend step, then a wait
for the backend's wake-up signal, never a fixed sleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from .errors import InvalidMessage, QueueFull
from .message import (
    Outgoing,
    Received,
    check_detail,
    check_name,
    check_number,
    encode_attributes,
    encode_body,
)
from .model.queues import (
    MAX_GROUP,
    MAX_PRIORITY_LIMIT,
    Envelope,
    Overflow,
    QueueConfig,
    QueueStats,
    check_count,
)
from .routing import check_routing_key

if TYPE_CHECKING:
    from .backends.base import Backend

__all__ = ["Envelope", "Overflow", "Queue", "QueueConfig", "QueueStats"]

T = TypeVar("T")


async def wait_for_room(
    backend: Backend,
    queue: str | None,
    timeout: float | None,
    attempt: Callable[[], Awaitable[T]],
) -> T:
    """Run ``attempt`` (a send or publish); while it fails with ``QueueFull`` on a queue with
    ``overflow="block"``, wait for that queue to change and try again, up to ``timeout``
    seconds (None: no limit). ``queue`` names the queue expected to fill, if known.

    The wake-up token of the full queue is always taken before the attempt that finds it
    full, so an ack between the attempt and the wait is never missed.
    """
    if timeout is not None:
        timeout = check_number("timeout", timeout)
    wakeups = backend.wakeups
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    watched = queue
    while True:
        token = wakeups.token(watched) if watched is not None else None
        try:
            return await attempt()
        except QueueFull as full:
            if full.overflow != "block":
                raise
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise QueueFull(
                    full.name,
                    full.max_length,
                    f"no room within the send timeout of {timeout:g} s",
                    "block",
                ) from None
            if token is None or full.name != watched:
                watched = full.name  # now we know which queue to watch: try once more
                continue
        await wakeups.wait(token, remaining)


def _check_tag(name: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_GROUP:
        raise InvalidMessage(f"{name} must be a string of 1-{MAX_GROUP} characters, got {value!r}")
    if "\x00" in value:  # no engine's text type takes it alike (PostgreSQL refuses it)
        raise InvalidMessage(f"{name} cannot contain NUL characters: {value!r}")
    return value


def make_envelope(
    body: object,
    attributes: Mapping[str, str] | None,
    delay: float,
    priority: int,
    group: str | None,
    dedup_id: str | None,
    max_bytes: int,
) -> Envelope:
    """Encode and check one message; raise before anything is stored."""
    if (
        type(body) is bytes
        and attributes is None
        and not delay
        and not priority
        and group is None
        and dedup_id is None
        and len(body) <= max_bytes
    ):
        return Envelope(body, {})  # the plain case: nothing to encode or check
    data, is_json = encode_body(body)
    if len(data) > max_bytes:
        from .errors import MessageTooLarge

        raise MessageTooLarge(len(data), max_bytes)
    attrs = encode_attributes(attributes, is_json)
    # a float whatever was written (0 or 0.0): a batch's delays go to an engine as one list
    delay = check_number("delay", delay) if delay else 0.0
    if priority:
        check_count("priority", priority, minimum=0, maximum=MAX_PRIORITY_LIMIT)
    return Envelope(
        data, attrs, delay, priority, _check_tag("group", group), _check_tag("dedup_id", dedup_id)
    )


def check_receive(
    max_messages: object, visibility_timeout: float | None, wait: float
) -> tuple[float | None, float]:
    """Check a receive's arguments (raise ``InvalidOption``); the visibility timeout and
    wait as numbers."""
    if type(max_messages) is not int or not 1 <= max_messages <= 10_000:
        check_count("max_messages", max_messages, minimum=1, maximum=10_000)
    if visibility_timeout is not None:
        visibility_timeout = check_number("visibility_timeout", visibility_timeout, strict=True)
    if wait:
        wait = check_number("wait", wait)
    return visibility_timeout, wait


def make_envelopes(
    messages: Iterable[Outgoing], max_bytes: int, op: str, topic: bool = False
) -> list[Envelope]:
    """Encode and check a batch of ``Outgoing`` for ``op`` (``send_batch``, ...); raise
    before anything is stored. A bytes body with no options takes a fast path. For a topic
    (``topic=True``) the routing key is checked and kept; group and priority are refused."""
    envs = []
    for m in messages:
        if (
            type(m) is Outgoing
            and type(m.body) is bytes
            and (  # the plain case, fast
                m.attributes is None
                and not m.delay
                and not m.priority
                and m.group is None
                and m.dedup_id is None
                and len(m.body) <= max_bytes
            )
        ):
            env = Envelope(m.body, {})
        else:
            if not isinstance(m, Outgoing):
                raise InvalidMessage(f"{op} takes fairq.Outgoing items, got {type(m).__name__}")
            if topic and (m.group is not None or m.priority):
                raise InvalidMessage("publish does not take group or priority (queues do)")
            env = make_envelope(
                m.body, m.attributes, m.delay, m.priority, m.group, m.dedup_id, max_bytes
            )
        if topic:
            env.routing_key = check_routing_key(m.routing_key)
        envs.append(env)
    return envs


class Queue:
    """A handle to one queue. Cheap to create; ``broker.queue(name)`` makes one.

    Using a handle to a queue that does not exist raises ``fairq.QueueNotFound``.
    """

    __slots__ = ("_backend", "_max_bytes", "name")

    def __init__(self, backend: Backend, name: str, max_message_bytes: int) -> None:
        self.name = check_name(name)
        self._backend = backend
        self._max_bytes = max_message_bytes

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"

    # -- sending ---------------------------------------------------------------------------
    async def send(
        self,
        body: object,
        attributes: Mapping[str, str] | None = None,
        delay: float = 0.0,
        priority: int = 0,
        group: str | None = None,
        dedup_id: str | None = None,
        timeout: float | None = None,
        connection: object | None = None,
    ) -> str:
        """Store one message and return its id.

        ``delay`` hides it for that many seconds; ``priority`` (0..``max_priority``) puts
        it ahead of lower ones; ``group`` orders it within its FIFO group; a repeated
        ``dedup_id`` within the queue's ``dedup_window`` stores nothing and returns the
        first message's id. On a full queue with ``overflow="block"``, waits up to
        ``timeout`` seconds (None: as long as it takes) for room.

        ``connection`` (PostgreSQL): the caller's own psycopg ``AsyncConnection`` inside its
        transaction — the outbox: consumers see the message only once that transaction
        commits, and nothing of it remains after a rollback. Other backends raise
        ``Unsupported``.
        """
        env = make_envelope(body, attributes, delay, priority, group, dedup_id, self._max_bytes)
        if timeout is None and connection is None:
            # the common case, as _send's, without its coroutine: one frame fewer a message
            try:
                return (await self._backend.send(self.name, [env]))[0]
            except QueueFull as full:
                if full.overflow != "block":
                    raise
        ids = await self._send([env], timeout, connection)
        return ids[0]

    async def send_batch(
        self,
        messages: Iterable[Outgoing],
        timeout: float | None = None,
        connection: object | None = None,
    ) -> list[str]:
        """Store all messages or none (one atomic step); return their ids in order
        (``connection``: in the caller's transaction, as for :meth:`send`)."""
        envs = make_envelopes(messages, self._max_bytes, "send_batch")
        if not envs:
            return []
        return await self._send(envs, timeout, connection)

    async def _send(
        self, envs: list[Envelope], timeout: float | None, connection: object | None = None
    ) -> list[str]:
        if timeout is not None:
            check_number("timeout", timeout)
        backend = self._backend
        if connection is not None:
            return await wait_for_room(
                backend, self.name, timeout, lambda: backend.send_in(connection, self.name, envs)
            )
        try:  # the common case: no bounded queue in the way, no wake-up token needed
            return await backend.send(self.name, envs)
        except QueueFull as full:
            if full.overflow != "block":
                raise
        return await wait_for_room(
            backend, self.name, timeout, lambda: backend.send(self.name, envs)
        )

    # -- receiving -------------------------------------------------------------------------
    async def receive(
        self,
        max_messages: int = 1,
        visibility_timeout: float | None = None,
        wait: float = 0.0,
    ) -> list[Received]:
        """Lease up to ``max_messages`` visible messages.

        Each is hidden from other receivers for ``visibility_timeout`` seconds (default:
        the queue's). With ``wait`` > 0, waits up to that long for a first message and
        returns as soon as one is there; an empty list means none came.
        """
        visibility_timeout, wait = check_receive(max_messages, visibility_timeout, wait)
        backend = self._backend
        if wait <= 0:
            return self._attach(await backend.receive(self.name, max_messages, visibility_timeout))
        wakeups = backend.wakeups
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            token = wakeups.token(self.name)
            got = await backend.receive(self.name, max_messages, visibility_timeout)
            if got:
                return self._attach(got)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            await wakeups.wait(token, remaining)

    def _attach(self, messages: list[Received]) -> list[Received]:
        for m in messages:
            m._queue = self
        return messages

    # -- settling --------------------------------------------------------------------------
    async def ack_batch(self, receipts: Sequence[str]) -> None:
        """Ack many deliveries in one step. Receipts whose lease is gone are left alone and
        reported in one ``LeaseLost`` (its ``lost`` lists them) after the others are acked."""
        receipts = list(receipts)
        if not receipts:
            return
        lost = await self._backend.ack(self.name, receipts)
        if lost:
            from .errors import LeaseLost

            raise LeaseLost(lost)

    async def _ack_one(self, receipt: str, connection: object | None = None) -> None:
        if connection is None:
            lost = await self._backend.ack(self.name, [receipt])
        else:
            lost = await self._backend.ack_in(connection, self.name, [receipt])
        if lost:
            from .errors import LeaseLost

            raise LeaseLost(lost)

    async def _nack(self, receipt: str, delay: float, error: str | None = None) -> None:
        delay = check_number("delay", delay)
        if error is not None:
            error = check_detail("error", error)
        await self._backend.nack(self.name, receipt, delay, error)

    async def _extend_one(self, receipt: str, seconds: float) -> None:
        seconds = check_number("seconds", seconds, strict=True)
        lost = await self._backend.extend(self.name, [receipt], seconds)
        if lost:
            from .errors import LeaseLost

            raise LeaseLost(lost)

    async def extend_batch(self, receipts: Sequence[str], seconds: float) -> list[str]:
        """Extend many leases to ``seconds`` from now; return the receipts whose lease was gone."""
        seconds = check_number("seconds", seconds, strict=True)
        return await self._backend.extend(self.name, list(receipts), seconds)

    async def release_batch(self, receipts: Sequence[str]) -> list[str]:
        """Give deliveries back at once without counting them as attempts (used by a worker
        that shuts down before it started them); return the receipts whose lease was gone."""
        return await self._backend.release(self.name, list(receipts))

    async def _dead_letter(self, receipt: str, reason: str) -> None:
        await self._backend.dead_letter(self.name, receipt, check_detail("reason", reason))

    # -- managing --------------------------------------------------------------------------
    async def stats(self) -> QueueStats:
        """The queue's counts, oldest age and counters."""
        return await self._backend.stats(self.name)

    async def purge(self) -> int:
        """Delete every message (visible, delayed and in flight); return how many."""
        return await self._backend.purge(self.name)

    async def config(self) -> QueueConfig:
        """The options the queue is declared with."""
        return await self._backend.queue_config(self.name)

    async def peek(self, limit: int = 10) -> list[Received]:
        """Up to ``limit`` messages, oldest sent first (ready, delayed or leased), without
        leasing them (receipt is "")."""
        check_count("limit", limit, minimum=1, maximum=10_000)
        return await self._backend.peek(self.name, limit)
