"""Wake-ups across processes: one dedicated connection per broker LISTENs on the
schema's channel; every send, nack, release, bounded-queue ack, FIFO advance and attention
signal NOTIFYs it (in its own transaction, so a caller's outbox wakes consumers only when
it commits). A notification wakes the waiters of the queue it names.

The channel also carries ``Topic.listen`` broadcasts (``t:`` with the messages, or ``b:``
naming a row of ``broadcasts`` for payloads past NOTIFY's 8,000-byte limit).

When the connection drops (the server restarted), or stops answering (a ping every 5 s
without notifications, within the timeout), the loop reconnects with backoff;
meanwhile :meth:`changed_elsewhere` answers True at every poll, so waiters fall back to
polling, and after the reconnect the pool's idle connections are checked and every waiter
is woken. With ``?listen=off`` (a pooler in transaction mode, which drops LISTEN) the same
polling is the mechanism, every ``poll`` seconds. A slow safety poll (every 5 s) covers a
notification lost in between.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import orjson
import psycopg
from psycopg.pq import TransactionStatus

from ...model.queues import Envelope
from .connection import Deadline, abandon

if TYPE_CHECKING:
    from . import PostgresBackend

__all__ = ["ORIGIN", "Listener", "encode_broadcast"]

log = logging.getLogger("fairq.postgres")
#: this process, so a broker skips its own broadcasts (its handle delivered them already)
ORIGIN = uuid.uuid4().hex[:12]
_SAFETY_POLL = 5.0
_MAX_PAYLOAD = 7900
_LISTENER_TTL = 30.0
#: seconds without a notification after which the LISTEN connection is pinged
_PING_EVERY = 5.0


def encode_broadcast(topic: str, items: Sequence[tuple[Envelope, str]]) -> bytes:
    return orjson.dumps(
        {
            "o": ORIGIN,
            "t": topic,
            "m": [
                [mid, base64.b64encode(e.body).decode(), e.attributes, e.routing_key]
                for e, mid in items
            ],
        }
    )


class ListenSink(Protocol):
    """Where the listener hands other processes' publishes for this process's ephemeral
    listeners (``Topic.listen``), and whether a topic still has one."""

    def deliver_once(self, topic: str, items: Sequence[tuple[Envelope, str]]) -> None: ...

    def listening(self, topic: str) -> bool: ...


class TopicSinks:
    """The :class:`ListenSink` of one backend: ``Backend.attach_listeners``'s callbacks by
    topic (the listener hub of ``fairq.pubsub`` dedups what it is handed twice)."""

    def __init__(self) -> None:
        self.by_topic: dict[str, Callable[[list[tuple[Envelope, str]]], None]] = {}

    def deliver_once(self, topic: str, items: Sequence[tuple[Envelope, str]]) -> None:
        deliver = self.by_topic.get(topic)
        if deliver is not None:
            deliver(list(items))

    def listening(self, topic: str) -> bool:
        return topic in self.by_topic


class Listener:
    """The LISTEN connection of one backend (see the module docstring)."""

    def __init__(self, backend: PostgresBackend) -> None:
        self.backend = backend
        self.origin = ORIGIN
        self.listening = False
        self.sinks: list[ListenSink] = []  # this process's listener hubs (one per scope)
        self._task: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._last_safety = time.monotonic()
        self._ready = asyncio.Event()
        self._fresh = False
        self._stopping = False
        self._topics: set[str] = set()  # topics with live local listeners (renewed rows)
        self.session = uuid.uuid4().hex
        self._renewer: asyncio.Task[None] | None = None
        self._renew_now = asyncio.Event()

    def ensure_started(self) -> None:
        """Start listening (at the first wait, so an idle broker holds one connection)."""
        if self._task is None and not self._stopping and self.backend.options.listen:
            self._task = asyncio.create_task(self._run(), name="fairq-postgres-listen")

    async def start(self) -> None:
        self.ensure_started()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.backend.options.connect_timeout):
                await self._ready.wait()

    async def stop(self) -> None:
        self._stopping = True
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._renewer
        conn = self._conn
        if conn is not None and conn.pgconn.transaction_status == TransactionStatus.ACTIVE:
            # a ping in flight: cancelling it would make psycopg wait for the server's
            # answer to a cancel request, which a server that went quiet never sends
            abandon(conn)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()

    def changed_elsewhere(self) -> bool:
        self.ensure_started()
        if not self.listening or self._fresh:
            self._fresh = False  # just started: what came before LISTEN is looked at once
            return True  # no notifications: poll
        now = time.monotonic()
        if now - self._last_safety >= _SAFETY_POLL:
            self._last_safety = now
            return True
        return False

    async def _run(self) -> None:
        backend = self.backend
        opts = backend.options
        delay = 0.05
        first = True
        while not self._stopping:
            try:
                async with Deadline(opts.connect_timeout + opts.timeout) as limit:
                    conn = await psycopg.AsyncConnection.connect(opts.conninfo, autocommit=True)
                    self._conn = conn
                    with limit.using(conn):
                        await conn.execute(f'LISTEN "{opts.channel}"')
                        if not first:
                            await backend.measure_clock(conn)
                if not first:
                    await backend.pool.check()
                self.listening = True
                self._fresh = True
                self._ready.set()
                delay = 0.05
                if not first:
                    log.info("postgresql is back: wake-ups by LISTEN again")
                    backend.wakeups.notify_all()
                first = False
                while not self._stopping:
                    async for note in conn.notifies(timeout=_PING_EVERY):
                        await self._on_notify(note.payload)
                    await self._ping(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.listening:
                    log.warning("LISTEN connection lost (%s); polling until it is back", exc)
                    backend.pool.suspect()  # the pool's idle connections may be gone too
                self.listening = False
                self._ready.set()
                backend.wakeups.notify_all()
                if self._conn is not None:
                    abandon(self._conn)
                    with contextlib.suppress(Exception):
                        await self._conn.close()
                    self._conn = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _ping(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """A quiet LISTEN connection may be dead without knowing it (a partition, a
        server that hangs): a statement that does not answer within the timeout gives it
        up (an error, so :meth:`_run` reconnects and waiters poll meanwhile)."""
        async with Deadline(self.backend.options.timeout) as limit:
            with limit.using(conn):
                await conn.execute("SELECT 1")
        if limit.expired:
            raise self.backend.pool.timed_out()

    async def _on_notify(self, payload: str) -> None:
        kind, _, rest = payload.partition(":")
        wakeups = self.backend.wakeups
        if kind == "q":
            wakeups.notify((rest,))
        elif kind == "a":
            wakeups.notify((f"attention:{rest}",))
        elif kind == "t":
            self._deliver(rest.encode())
        elif kind == "b":
            try:
                data = await self._fetch_broadcast(int(rest))
            except Exception:
                log.debug("broadcast %s could not be read", rest, exc_info=True)
                return
            if data is not None:
                self._deliver(data)

    async def _fetch_broadcast(self, bid: int) -> bytes | None:
        async def go(cur: Any) -> bytes | None:
            await cur.execute(
                f"SELECT payload FROM {self.backend.s}.broadcasts WHERE id = %s", (bid,)
            )
            row = await cur.fetchone()
            return None if row is None else bytes(row[0])

        result: bytes | None = await self.backend.pool.run(go)
        return result

    def _deliver(self, raw: bytes) -> None:
        if not self.sinks:
            return
        data = orjson.loads(raw)
        items = [
            (Envelope(base64.b64decode(body), dict(attrs), routing_key=key), mid)
            for mid, body, attrs, key in data["m"]
        ]
        for sink in self.sinks:
            sink.deliver_once(data["t"], items)

    # -- ephemeral listeners ---------------------------------------------------------------
    def watch(self, topic: str, sink: ListenSink) -> None:
        """A local listener of ``topic`` exists: keep a live row in ``listeners`` (renewed
        while it listens) so publishers anywhere broadcast the topic's messages."""
        if sink not in self.sinks:
            self.sinks.append(sink)
        self._topics.add(topic)
        self.ensure_started()
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._renew(), name="fairq-postgres-listeners")
        else:
            self._renew_now.set()

    async def _renew(self) -> None:
        backend = self.backend
        from .topics import renew_listeners

        while not self._stopping:
            topics = sorted(t for t in self._topics if any(s.listening(t) for s in self.sinks))
            self._topics = set(topics)
            until = backend.now() + _LISTENER_TTL

            async def renew(cur: Any, topics: list[str] = topics, until: float = until) -> None:
                await renew_listeners(cur, backend.s, topics, self.session, until)

            try:
                await backend.pool.run(renew)
            except Exception:
                log.debug("could not renew the listeners' rows", exc_info=True)
            if not topics:
                return
            self._renew_now.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_LISTENER_TTL / 3):
                    await self._renew_now.wait()


__all__ += ["_LISTENER_TTL", "_MAX_PAYLOAD"]
