"""``postgresql://user:pass@host:port/db?schema=fairq``: fairq on PostgreSQL.

The tables live in their own schema (default ``fairq``), made by the versioned migrations
of ``migrations/`` (applied on connect under an advisory lock; ``fairq migrate``), laid
out in ``TABLES.md``. Each seam method is one statement — a PL/pgSQL function for the
queue operations, on a pooled autocommit connection — or one transaction; leases are
``FOR UPDATE SKIP LOCKED``; wake-ups come by LISTEN/NOTIFY on one dedicated connection
per broker (:mod:`.listener`), with a slow safety poll.

``connection=`` (the outbox and inbox, SPEC §11): ``send``, ``publish``,
``attention_publish``, ``ack`` and ``claim`` run on the caller's psycopg
``AsyncConnection`` inside the caller's transaction (a savepoint of it), so they commit or
roll back with the caller's own rows; NOTIFYs go out at that commit.

Time: every statement takes ``now`` from the broker's clock. With no clock injected
(``clock=auto``, the default) that clock is the server's — the local clock corrected by
the offset to ``clock_timestamp()`` measured at connect and on each reconnect — so
clients whose own clocks differ still agree on leases, delays and windows (to within a
round trip). ``?clock=client`` trusts the local clock instead; then clients' clocks must
agree (NTP), and a skew of s seconds shifts leases, delays and dedup windows by s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import psycopg

from ...clock import Clock, ManualClock, SystemClock
from ...errors import ConnectionError, FairqError, LeaseLost, QueueNotFound
from ...message import Received
from ...model.attention import (
    AttentionConfig,
    AttentionStats,
    KeyStats,
    SignalHint,
    Slice,
    TenantStats,
)
from ...model.idempotency import IdempotencyRecord, Version
from ...model.queues import Envelope, QueueConfig, QueueStats
from ...model.rooms import Place, RoomRecord, RoomStats, TickResult
from ...model.topics import PublishResult, Subscription, TopicConfig, TopicStats
from ..base import Backend
from . import attention, attention_keys, idempotency, migrate, queues, rooms, topics
from .attention_rows import Scheduled
from .connection import Cursor, Deadline, Options, Pool, parse_url
from .listener import Listener, TopicSinks
from .queries import Queries

__all__ = ["OffsetClock", "PostgresBackend"]

log = logging.getLogger("fairq.postgres")
_REDRIVE_CHUNK = 1000
_SWEEP_EVERY = 30.0  # seconds between sweeps of expired side-table rows


class OffsetClock:
    """The server's clock, read locally: ``time.time()`` plus the measured offset."""

    __slots__ = ("offset",)

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def now(self) -> float:
        return time.time() + self.offset


class PostgresBackend(Backend):
    """See the module docstring."""

    def __init__(self, url: str, clock: Clock) -> None:
        self.options: Options = parse_url(url)
        server_clock = self.options.clock == "server" or (
            self.options.clock == "auto" and type(clock) is SystemClock
        )
        self._offset_clock = OffsetClock() if server_clock else None
        super().__init__(self._offset_clock or clock)
        self.q = Queries.for_schema(self.options.schema)
        self.s = self.q.s
        self.pool = Pool(self.options)
        self.listener = Listener(self)
        self._sinks = TopicSinks()  # Topic.listen's callbacks, by topic
        self.poll_interval = self.options.poll if not self.options.listen else 1.0
        self._topics = topics.TopicCache()
        self._acks = queues.AckCoalescer(self._ack_now)
        self.att_scheduled = Scheduled()  # the delayed attention signals this broker wrote
        self._last_sweep = 0.0
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def manual_clock(self) -> bool:
        return isinstance(self.clock, ManualClock)

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:
        opts = self.options
        # connecting and migrating on a connection of its own, within a limit too (a
        # server that accepts and then stops answering must not hang connect()); the
        # migrations may wait for another process's under the advisory lock: 60 s at least
        deadline = Deadline(opts.connect_timeout + max(60.0, opts.timeout))
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            async with deadline:
                conn = await psycopg.AsyncConnection.connect(opts.conninfo, autocommit=True)
                with deadline.using(conn):
                    await self._prepare_schema(conn)
        except FairqError:
            raise
        except (psycopg.Error, TimeoutError) as exc:
            if conn is None and not deadline.expired:
                raise ConnectionError(
                    f"cannot connect to {opts.masked}: {_mask(str(exc).strip())}"
                ) from exc
            if deadline.expired:
                raise ConnectionError(
                    f"cannot connect to {opts.masked}: no answer within {deadline.seconds:g} s"
                ) from exc
            raise self.pool.error(exc) from exc
        finally:
            if conn is not None:
                await conn.close()
        await self.pool.open()

    async def _prepare_schema(self, conn: psycopg.AsyncConnection[Any]) -> None:
        opts = self.options
        if opts.migrate:
            await migrate.apply(conn, opts.schema, opts.channel)
        else:
            todo = await migrate.pending(conn, opts.schema)
            if todo:
                raise FairqError(
                    f"schema {opts.schema!r} needs {len(todo)} migration(s) and migrate=off:"
                    " run `fairq migrate`"
                )
        await self.measure_clock(conn)
        cur = await conn.execute("SELECT current_setting('autovacuum')")
        row = await cur.fetchone()
        if row is not None and row[0] != "on":
            log.warning(
                "autovacuum is off on %s: acked messages leave dead rows that nothing "
                "removes; fairq's tables will grow until someone runs VACUUM",
                opts.masked,
            )

    async def measure_clock(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Measure the offset of the server's clock (with ``clock=server``/``auto``)."""
        if self._offset_clock is None:
            return
        best: tuple[float, float] | None = None
        for _ in range(3):
            t0 = time.time()
            cur = await conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
            row = await cur.fetchone()
            t1 = time.time()
            assert row is not None
            sample = (t1 - t0, float(row[0]) - (t0 + t1) / 2)
            if best is None or sample[0] < best[0]:
                best = sample
        assert best is not None
        self._offset_clock.offset = best[1]

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.wakeups.close()
        if self._sweeper is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._sweeper), self.options.timeout)
        await self.listener.stop()
        await self.pool.close()

    async def ping(self) -> None:
        """After connection trouble, a connection of its own (``Pool.probe``): a server
        that refuses connections is reported at once, not after the pool's wait."""
        if self.pool.troubled:
            await self.pool.probe()
        else:
            await super().ping()

    def listen_scope(self) -> Hashable:
        return ("postgresql", self.options.conninfo, self.options.schema)

    # -- running ---------------------------------------------------------------------------
    def now(self) -> float:
        return self.clock.now()

    async def _one(self, query: str, params: tuple[Any, ...], connection: object = None) -> Any:
        """The first column of the first row of one statement."""

        async def go(cur: Cursor) -> Any:
            await cur.execute(query, params)
            row = await cur.fetchone()
            return None if row is None else row[0]

        return await self.pool.run(go, connection=connection)

    async def _rows(
        self, query: str, params: tuple[Any, ...], binary: bool = False
    ) -> list[tuple[Any, ...]]:
        """The rows of one statement that wakes nobody (a receive, a listing); ``binary``:
        in PostgreSQL's binary format (message bodies as they are, not hex)."""

        async def go(cur: Cursor) -> list[tuple[Any, ...]]:
            await cur.execute(query, params, binary=binary)
            return await cur.fetchall()

        return await self.pool.run(go, wakes=False)

    def _woke(self, *queues: str) -> None:
        self.wakeups.notify(queues)

    async def _maybe_sweep(self) -> None:
        """Now and then: delete expired dedup, idempotency and broadcast rows, in small
        batches (nothing of fairq's grows without bound). In a task of its own, so the
        operation that triggered it neither waits for it nor shares its timeout with it;
        with a manual clock (tests), at once."""
        now = self.now()
        if now - self._last_sweep < _SWEEP_EVERY and not self.manual_clock:
            return
        self._last_sweep = now
        if self.manual_clock:
            await self._sweep(now)
        elif self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep(now), name="fairq-postgres-sweep")

    async def _sweep(self, now: float) -> None:
        async def go(cur: Cursor) -> None:
            await cur.execute(f"SELECT {self.s}.drop_expired_dedup(%s)", (now,))
            await topics.sweep(cur, self.s, now)
            await idempotency.sweep(cur, self.s, now)

        try:
            await self.pool.run(go)
        except FairqError:
            log.debug("side-table sweep failed", exc_info=True)

    # -- queues ----------------------------------------------------------------------------
    async def declare_queue(self, name: str, config: QueueConfig) -> None:
        now = self.now()
        await self.pool.run(
            lambda cur: queues.declare_queue(cur, self.s, name, config, now), transaction=True
        )
        self._woke(name)

    async def queue_config(self, name: str) -> QueueConfig:
        config = await self.pool.run(lambda cur: queues.queue_config(cur, self.q, name))
        if config is None:
            raise QueueNotFound(name)
        return config

    async def delete_queue(self, name: str) -> bool:
        done = await self.pool.run(
            lambda cur: queues.delete_queue(cur, self.s, name), transaction=True
        )
        self._topics.clear()
        self._woke(name)
        return bool(done)

    async def list_queues(self, prefix: str = "") -> list[str]:
        return [r[0] for r in await self._rows(self.q.queue_names, (prefix, prefix))]

    # -- messages --------------------------------------------------------------------------
    async def send(
        self, queue: str, envelopes: list[Envelope], connection: object | None = None
    ) -> list[str]:
        from ...message import format_id

        bodies, attrs, delays, prios, groups, dedups = queues.envelope_arrays(envelopes)
        ids = await self._one(
            self.q.send,
            (queue, self.now(), bodies, attrs, delays, prios, groups, dedups),
            connection,
        )
        if connection is None:
            self._woke(queue)
            if dedups is not None:
                await self._maybe_sweep()
        return [format_id(i) for i in ids]

    async def receive(
        self, queue: str, max_messages: int, visibility_timeout: float | None
    ) -> list[Received]:
        rows = await self._rows(
            self.q.receive, (queue, self.now(), max_messages, visibility_timeout), binary=True
        )
        return queues.received_rows(rows, queue)

    async def ack(
        self, queue: str, receipts: list[str], connection: object | None = None
    ) -> list[str]:
        if connection is not None:
            ids, leases = queues.receipts_literals(receipts)
            lost = await self._one(self.q.ack, (queue, self.now(), ids, leases), connection)
            return queues.lost_of(lost, receipts)
        if len(receipts) > 1:  # a batch already: nothing to gain by waiting for others
            return await self._ack_now(queue, receipts)
        return await self._acks.ack(queue, receipts)

    async def _ack_now(self, queue: str, receipts: list[str]) -> list[str]:
        """One ack statement for ``receipts`` (the coalescer's flush); the NOTIFY round
        trip after it only when the ack noted a wake-up (a bounded or FIFO queue)."""
        ids, leases = queues.receipts_literals(receipts)
        params = (queue, self.now(), ids, leases)

        async def go(cur: Cursor) -> tuple[list[int] | None, bool]:
            await cur.execute(self.q.ack, params)
            row = await cur.fetchone()
            assert row is not None
            return row[0], bool(row[1])

        lost, woke = await self.pool.run(go, wakes=lambda r: r[1])
        if woke:
            self._woke(queue)
        return queues.lost_of(lost, receipts)

    async def nack(self, queue: str, receipt: str, delay: float, error: str | None = None) -> None:
        (mid,), (lease,) = queues.receipts_arrays([receipt])
        try:
            await self._one(self.q.nack, (queue, self.now(), mid, lease, delay, error))
        except LeaseLost:
            raise LeaseLost([receipt]) from None
        self._woke(queue)

    async def extend(self, queue: str, receipts: list[str], seconds: float) -> list[str]:
        ids, leases = queues.receipts_arrays(receipts)
        lost = await self._one(self.q.extend, (queue, self.now(), ids, leases, seconds))
        return queues.lost_of(lost, receipts)

    async def release(self, queue: str, receipts: list[str]) -> list[str]:
        ids, leases = queues.receipts_arrays(receipts)
        lost = await self._one(self.q.release, (queue, self.now(), ids, leases))
        self._woke(queue)
        return queues.lost_of(lost, receipts)

    async def dead_letter(self, queue: str, receipt: str, reason: str) -> None:
        (mid,), (lease,) = queues.receipts_arrays([receipt])
        try:
            await self._one(self.q.reject, (queue, self.now(), mid, lease, reason))
        except LeaseLost:
            raise LeaseLost([receipt]) from None
        self._woke(queue)  # its room is free: a blocked sender goes on

    async def stats(self, queue: str) -> QueueStats:
        async def go(cur: Cursor) -> QueueStats:
            await cur.execute(self.q.stats, (queue, self.now()))
            row = await cur.fetchone()
            assert row is not None
            config = await queues.queue_config(cur, self.q, queue)
            assert config is not None
            return queues.stats_of(row, config)

        return await self.pool.run(go)

    async def purge(self, queue: str) -> int:
        n = await self._one(self.q.purge, (queue,))
        self._woke(queue)
        return int(n)

    async def peek(self, queue: str, limit: int) -> list[Received]:
        async def go(cur: Cursor) -> list[tuple[Any, ...]]:
            await cur.execute(self.q.peek, (queue, limit))
            rows = await cur.fetchall()
            if not rows and await queues.queue_config(cur, self.q, queue) is None:
                raise QueueNotFound(queue)
            return rows

        rows = await self.pool.run(go)
        return [queues.received((*r, None), queue) for r in rows]

    async def redrive(self, queue: str, to: str | None, limit: int | None) -> int:
        moved = 0
        after = 0
        while limit is None or moved < limit:
            chunk = _REDRIVE_CHUNK if limit is None else min(_REDRIVE_CHUNK, limit - moved)

            async def go(cur: Cursor, chunk: int = chunk, after: int = after) -> tuple[Any, ...]:
                await cur.execute(self.q.redrive, (queue, to, self.now(), chunk, after))
                row = await cur.fetchone()
                assert row is not None
                return row

            n, last = await self.pool.run(go)
            moved += n
            if last is None:
                break
            after = last
        self.wakeups.notify_all()
        return moved

    # -- topics ----------------------------------------------------------------------------
    async def declare_topic(self, name: str, config: TopicConfig) -> None:
        now = self.now()
        await self.pool.run(
            lambda cur: topics.declare_topic(cur, self.s, name, config, now), transaction=True
        )

    async def topic_config(self, name: str) -> TopicConfig:
        return await self.pool.run(lambda cur: topics.topic_config(cur, self.s, name))

    async def delete_topic(self, name: str) -> bool:
        done = await self.pool.run(
            lambda cur: topics.delete_topic(cur, self.s, name), transaction=True
        )
        self._topics.clear()
        self.wakeups.notify_all()
        return done

    async def list_topics(self, prefix: str = "") -> list[str]:
        return await self.pool.run(lambda cur: topics.names(cur, self.s, "topics", prefix))

    async def subscribe(self, subscription: Subscription, config: QueueConfig) -> None:
        now = self.now()
        await self.pool.run(
            lambda cur: topics.subscribe(cur, self.s, subscription, config, now),
            transaction=True,
        )
        self._topics.clear()

    async def unsubscribe(self, topic: str, name: str) -> bool:
        done = await self.pool.run(
            lambda cur: topics.unsubscribe(cur, self.s, topic, name), transaction=True
        )
        self._topics.clear()
        return done

    async def subscriptions(self, topic: str) -> list[Subscription]:
        return await self.pool.run(lambda cur: topics.subscriptions(cur, self.s, topic))

    async def publish(
        self, topic: str, envelopes: list[Envelope], connection: object | None = None
    ) -> list[PublishResult]:
        now = self.now()
        results, touched = await self.pool.run(
            lambda cur: topics.publish(cur, self, topic, envelopes, now, self.listener.origin),
            transaction=True,
            connection=connection,
        )
        if connection is None:
            self._woke(*touched)
            if any(e.dedup_id is not None for e in envelopes):
                await self._maybe_sweep()
        return results

    async def topic_stats(self, topic: str) -> TopicStats:
        return await self.pool.run(lambda cur: topics.topic_stats(cur, self.s, topic))

    def attach_listeners(
        self, topic: str, deliver: Callable[[list[tuple[Envelope, str]]], None] | None
    ) -> None:
        if deliver is None:
            self._sinks.by_topic.pop(topic, None)  # its row lapses at the next renewal
            return
        self._sinks.by_topic[topic] = deliver
        self.listener.watch(topic, self._sinks)

    # -- attention -------------------------------------------------------------------------
    async def declare_attention(self, domain: str, config: AttentionConfig) -> None:
        await attention.declare_attention(self, domain, config)

    async def attention_config(self, domain: str) -> AttentionConfig:
        return await attention.attention_config(self, domain)

    async def list_attention(self, prefix: str = "") -> list[str]:
        return await attention.list_attention(self, prefix)

    async def delete_attention(self, domain: str) -> bool:
        return await attention.delete_attention(self, domain)

    async def attention_publish(
        self, domain: str, key: str, envelopes: list[Envelope], connection: object | None = None
    ) -> list[str]:
        return await attention.publish(self, domain, key, envelopes, connection)

    async def attention_take(self, domain: str) -> Slice | None:
        return await attention.take(self, domain)

    async def attention_receive(
        self, domain: str, token: str, n: int, visibility_timeout: float | None
    ) -> tuple[list[Received], float | None]:
        return await attention.receive(self, domain, token, n, visibility_timeout)

    async def attention_extend(self, domain: str, token: str) -> bool:
        return await attention.extend(self, domain, token)

    async def attention_end(
        self, domain: str, token: str, processed: int, retry_at: float | None
    ) -> None:
        await attention.end(self, domain, token, processed, retry_at)

    async def attention_progress(
        self, domain: str, token: str, key: str, queue: str, receipts: list[str]
    ) -> list[str]:
        if not receipts:
            return []
        return await attention.progress(self, domain, token, key, queue, receipts)

    async def attention_count(self, domain: str, token: str, key: str, n: int) -> None:
        await attention.count(self, domain, token, key, n)

    async def attention_set_resource(
        self, domain: str, key: str, plan: str | None, state: str | None, tenant: str | None
    ) -> None:
        await attention_keys.set_resource(self, domain, key, plan, state, tenant)

    async def attention_stats(self, domain: str) -> AttentionStats:
        return await attention_keys.stats(self, domain)

    async def attention_key_stats(self, domain: str, top: int) -> list[KeyStats]:
        return await attention_keys.key_stats(self, domain, top)

    async def attention_reconcile(self, domain: str) -> int:
        return await attention_keys.reconcile(self, domain)

    async def attention_tenant_stats(self, domain: str, top: int) -> list[TenantStats]:
        return await attention_keys.tenant_stats(self, domain, top)

    async def attention_next(self, domain: str) -> SignalHint:
        return await attention_keys.hint(self, domain)

    def attention_scheduled_here(self, domain: str, due: float) -> bool:
        return (domain, due) in self.att_scheduled

    # -- idempotency -----------------------------------------------------------------------
    async def claim(
        self,
        namespace: str,
        key: str,
        token: str,
        lease: float,
        fingerprint: str | None,
        connection: object | None = None,
    ) -> IdempotencyRecord | None:
        now = self.now()
        await self._maybe_sweep()
        return await self.pool.run(
            lambda cur: idempotency.claim(
                cur, self.s, namespace, key, token, lease, fingerprint, now
            ),
            connection=connection,
        )

    async def complete_claim(
        self, namespace: str, key: str, token: str, result: bytes | None, ttl: float
    ) -> bool:
        now = self.now()
        return await self.pool.run(
            lambda cur: idempotency.complete_claim(
                cur, self.s, namespace, key, token, result, ttl, now
            ),
            transaction=True,
        )

    async def release_claim(self, namespace: str, key: str, token: str) -> bool:
        return await self.pool.run(
            lambda cur: idempotency.release_claim(cur, self.s, namespace, key, token)
        )

    async def extend_claim(self, namespace: str, key: str, token: str, lease: float) -> bool:
        now = self.now()
        return await self.pool.run(
            lambda cur: idempotency.extend_claim(cur, self.s, namespace, key, token, lease, now)
        )

    async def idempotency_record(self, namespace: str, key: str) -> IdempotencyRecord | None:
        now = self.now()
        return await self.pool.run(lambda cur: idempotency.record(cur, self.s, namespace, key, now))

    async def forget_claim(self, namespace: str, key: str) -> bool:
        now = self.now()
        return await self.pool.run(lambda cur: idempotency.forget(cur, self.s, namespace, key, now))

    async def advance_version(self, namespace: str, entity: str, version: Version) -> bool:
        now = self.now()
        return await self.pool.run(
            lambda cur: idempotency.advance_version(cur, self.s, namespace, entity, version, now)
        )

    async def current_version(self, namespace: str, entity: str) -> Version | None:
        return await self.pool.run(
            lambda cur: idempotency.current_version(cur, self.s, namespace, entity)
        )

    async def add_counts(self, scope: str, counts: Mapping[str, int]) -> None:
        if any(counts.values()):
            await self.pool.run(
                lambda cur: idempotency.add_counts(cur, self.s, scope, dict(counts))
            )

    async def read_counts(self, scope: str) -> dict[str, int]:
        return await self.pool.run(lambda cur: idempotency.read_counts(cur, self.s, scope))

    async def drop_counts(self, scope: str) -> None:
        await self.pool.run(lambda cur: idempotency.drop_counts(cur, self.s, scope))

    # -- waiting rooms ---------------------------------------------------------------------
    async def _room(self, fn: Any, *args: Any) -> Any:
        now = self.now()
        return await self.pool.run(
            lambda cur: fn(rooms.Txn(cur, self.s, now), *args), transaction=True
        )

    async def declare_room(
        self,
        room: str,
        options: Mapping[str, object],
        secret_kid: str | None,
        seed: bytes,
        seed_kid: str,
    ) -> RoomRecord:
        result: RoomRecord = await self._room(
            rooms.declare_room, room, dict(options), secret_kid, seed, seed_kid
        )
        return result

    async def room_record(self, room: str) -> RoomRecord:
        result: RoomRecord = await self._room(rooms.room_record, room)
        return result

    async def list_rooms(self, prefix: str = "") -> list[str]:
        return await self.pool.run(lambda cur: topics.names(cur, self.s, "rooms", prefix))

    async def delete_room(self, room: str) -> bool:
        return bool(await self._room(rooms.delete_room, room))

    async def room_join(self, room: str, fans: list[str]) -> list[Place]:
        result: list[Place] = await self._room(rooms.join, room, fans)
        return result

    async def room_status(self, room: str, seq: int) -> Place:
        result: Place = await self._room(rooms.status, room, seq)
        return result

    async def room_tick(self, room: str, holder: str, lease: float) -> TickResult:
        result: TickResult = await self._room(rooms.tick, room, holder, lease)
        return result

    async def room_release_admitter(self, room: str, holder: str) -> bool:
        return bool(await self._room(rooms.release_admitter, room, holder))

    async def room_admit(self, room: str, n: int) -> int:
        return int(await self._room(rooms.admit, room, n))

    async def room_set_rate(self, room: str, rate: float) -> None:
        await self._room(rooms.set_rate, room, rate)

    async def room_consume(self, room: str, seq: int) -> str:
        return str(await self._room(rooms.consume, room, seq))

    async def room_sold_out(self, room: str) -> int:
        return int(await self._room(rooms.sold_out, room))

    async def room_close(self, room: str) -> None:
        await self._room(rooms.close, room)

    async def room_stats(self, room: str) -> RoomStats:
        result: RoomStats = await self._room(rooms.stats, room)
        return result

    # -- the caller's transaction (SPEC §11) ------------------------------------------------
    async def send_in(self, connection: object, queue: str, envelopes: list[Envelope]) -> list[str]:
        return await self.send(queue, envelopes, connection)

    async def publish_in(
        self, connection: object, topic: str, envelopes: list[Envelope]
    ) -> list[PublishResult]:
        return await self.publish(topic, envelopes, connection)

    async def attention_publish_in(
        self, connection: object, domain: str, key: str, envelopes: list[Envelope]
    ) -> list[str]:
        return await self.attention_publish(domain, key, envelopes, connection)

    async def ack_in(self, connection: object, queue: str, receipts: list[str]) -> list[str]:
        return await self.ack(queue, receipts, connection)

    async def claim_in(
        self,
        connection: object,
        namespace: str,
        key: str,
        token: str,
        ttl: float,
        fingerprint: str | None,
    ) -> IdempotencyRecord | None:
        now = self.now()
        return await self.pool.run(
            lambda cur: idempotency.claim_done(
                cur, self.s, namespace, key, token, ttl, fingerprint, now
            ),
            connection=connection,
        )

    async def complete_claim_in(
        self,
        connection: object,
        namespace: str,
        key: str,
        token: str,
        result: bytes | None,
        ttl: float,
    ) -> bool:
        now = self.now()
        return await self.pool.run(
            lambda cur: idempotency.complete_claim(
                cur, self.s, namespace, key, token, result, ttl, now
            ),
            connection=connection,
        )

    async def release_claim_in(
        self, connection: object, namespace: str, key: str, token: str
    ) -> bool:
        return await self.pool.run(
            lambda cur: idempotency.release_claim(cur, self.s, namespace, key, token, done=True),
            connection=connection,
        )

    # -- wake-ups --------------------------------------------------------------------------
    async def next_due(self) -> float | None:
        if self._closed:
            return None
        self.listener.ensure_started()
        # attention takers wait for their domain's own due times (attention_next), so a
        # delayed signal coming due wakes one taker, not every waiter of the process
        names = [w for w in self.wakeups._events if not w.startswith("attention:")]
        if not names:
            return None
        due = await self._one(self.q.next_due, (names, self.now()))
        return None if due is None else float(due)

    async def changed_elsewhere(self) -> bool:
        return self.listener.changed_elsewhere()


def _mask(text: str) -> str:
    from .connection import mask

    return mask(text)
