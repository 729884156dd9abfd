"""``sqlite:///path.db``: the embedded default backend, one file, several processes.

Each seam method is one function of the modules beside this one (``queues``, ``topics``,
``attention``, ``idempotency``, ``waitingroom``: SQL on one :class:`~.txn.Txn`), run in
the next group commit of the :class:`~.writer.Writer` (one ``BEGIN IMMEDIATE``
transaction for everything asked during one pass of the event loop). The tables are in
``schema.sql``.

Other processes on the same file are seen through ``PRAGMA data_version``. While someone
long-polls, it is checked whenever the ``-wal`` file is written (Linux inotify,
``watch.py``), so a ``receive(wait=...)`` returns within a millisecond or so of a send
from another process, and an idle waiter costs nothing between commits; where inotify is
not available it is checked every 20 ms instead.

URL options: ``synchronous=normal`` (default; WAL, survives any process crash) or
``full`` (also survives power loss), ``busy_timeout=<seconds>`` (default 10),
``page_size=<bytes>`` (a power of two from 512 to 65536, for a file created by this
connection; SQLite's 4096 otherwise — smaller pages make one-message commits cheaper and
big batches and big bodies dearer, docs/backends.md#sqlite), ``secure_delete=fast``
(default: a deleted message is zeroed on the pages its commit writes anyway), ``on`` (also
on pages freed whole) or ``off`` (left in place until the space is reused).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Hashable, Mapping

from ...clock import Clock
from ...errors import BackendError, FairqError, InvalidOption
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
from . import attention, attention_stats, idempotency, messages, topics, waitingroom
from . import queues as store
from .txn import Txn
from .watch import RECHECKS, WalWatch
from .writer import Writer

__all__ = ["SQLiteBackend"]

log = logging.getLogger("fairq.sqlite")
_REDRIVE_CHUNK = 1000  # messages moved per transaction by redrive
_SPIN = 0.0003  # seconds to watch for a commit whose WAL write was just seen
# (the queue exists, a message of it is visible, the earliest due delay or lease of any queue)
_NOTHING_TO_RECEIVE = (
    "SELECT EXISTS (SELECT 1 FROM fairq_queues WHERE name = ?), "
    # (a row leased in place stays in state 0, below avail_at 0: schema.sql, version 13)
    "EXISTS (SELECT 1 FROM fairq_messages INDEXED BY fairq_ix_ready WHERE state = 0 "
    "AND avail_at >= 0 AND queue_id = (SELECT id FROM fairq_queues WHERE name = ?)) "
    # one-message sends not yet moved out of the inbox (schema.sql): a few hundred rows at most
    "OR EXISTS (SELECT 1 FROM fairq_inbox WHERE queue_id = "
    "(SELECT id FROM fairq_queues WHERE name = ?)), "
    "(" + messages.NEXT_DUE + ")"
)


def _swept(t: Txn) -> None:
    """A transaction of its own, for what every transaction does first (writer._begin):
    the inbox drained, due delays and ended leases moved on, uncounted rows settled."""


def _page_size(text: str | None) -> int | None:
    """The ``page_size`` URL option: None, or a power of two from 512 to 65536."""
    if text is None:
        return None
    try:
        size = int(text)
    except ValueError:
        size = 0
    if not 512 <= size <= 65536 or size & (size - 1):
        raise InvalidOption(
            f"page_size must be a power of two from 512 to 65536 (bytes), got {text!r}"
        )
    return size


class SQLiteBackend(Backend):
    """See the module docstring."""

    poll_interval = 0.02

    def __init__(self, path: str, clock: Clock, options: dict[str, str]) -> None:
        super().__init__(clock)
        self.path = path
        self._scope = ("sqlite", os.path.realpath(path))  # resolved once, at open
        sync = options.pop("synchronous", "normal").lower()
        if sync not in ("normal", "full"):
            raise InvalidOption(f"synchronous must be normal or full, got {sync!r}")
        try:
            busy_timeout = float(options.pop("busy_timeout", "10"))
        except ValueError as exc:
            raise InvalidOption("busy_timeout must be a number of seconds") from exc
        page_size = _page_size(options.pop("page_size", None))
        secure_delete = options.pop("secure_delete", "fast").lower()
        if secure_delete not in ("on", "fast", "off"):
            raise InvalidOption(f"secure_delete must be on, fast or off, got {secure_delete!r}")
        if options:
            raise InvalidOption(f"unknown sqlite URL options: {', '.join(sorted(options))}")
        self._writer = Writer(
            path,
            sync.upper(),
            busy_timeout,
            clock,
            self.wakeups,
            page_size,
            secure_delete.upper(),
        )
        self._call = self._writer.call
        self._pulse_version: int | None = None
        self._watch: WalWatch | None = None  # opened at the first wait, kept until close
        self._watching = False  # the event loop reads the watch (someone waits)
        self._poke: Callable[[], None] | None = None
        self._rechecks = 0  # looks left after a WAL write that showed no new commit yet
        self._recheck: asyncio.TimerHandle | None = None
        self._own_commits = 0  # this backend's commits at the last look
        self._came_empty: set[str] = set()  # queues whose last receive here found nothing
        self._swept_due: float | None = None  # the past due time next_due last swept for

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:
        await self._writer.open()
        assert self._writer.conn is not None
        (self._pulse_version,) = self._writer.conn.execute("PRAGMA data_version").fetchone()

    async def close(self) -> None:
        self.wakeups.close()
        self._drop_watch()
        await self._writer.close()

    # -- queues ----------------------------------------------------------------------------
    async def declare_queue(self, name: str, config: QueueConfig) -> None:
        await self._call(store.declare_queue, name, config)

    async def queue_config(self, name: str) -> QueueConfig:
        return await self._call(store.queue_config, name)

    async def delete_queue(self, name: str) -> bool:
        return await self._call(store.delete_queue, name)

    async def list_queues(self, prefix: str = "") -> list[str]:
        return await self._call(Txn.names, "fairq_queues", prefix)

    # -- messages --------------------------------------------------------------------------
    # send and ack hand back the writer's future (awaitable like the coroutine the base
    # class declares), one coroutine fewer on the path every message takes
    def send(self, queue: str, envelopes: list[Envelope]) -> asyncio.Future[list[str]]:  # type: ignore[override]
        return self._call(store.send, queue, envelopes)

    async def receive(
        self, queue: str, max_messages: int, visibility_timeout: float | None
    ) -> list[Received]:
        if queue in self._came_empty and self._nothing_to_receive(queue):
            # answered without the writer thread: yield once, or a loop polling an empty
            # queue would never let the event loop run anything else (a producer, a timer)
            await asyncio.sleep(0)
            return []
        got = await self._call(store.receive, queue, max_messages, visibility_timeout)
        if got:
            self._came_empty.discard(queue)
        else:
            self._came_empty.add(queue)
        return got

    def _nothing_to_receive(self, queue: str) -> bool:
        """After an empty receive (a long poll, an idle worker): whether the queue is still
        empty — nothing visible, nothing of any queue coming due — read without the write
        lock, so a waiting consumer's retries do not take turns with a producer's commits."""
        conn = self._writer.conn
        if conn is None or conn.in_transaction:
            return False
        try:
            known, ready, due = conn.execute(_NOTHING_TO_RECEIVE, (queue, queue, queue)).fetchone()
        except sqlite3.Error:
            return False  # the write transaction will say what is wrong
        return bool(known) and not ready and (due is None or due > self.clock.now())

    def ack(self, queue: str, receipts: list[str]) -> asyncio.Future[list[str]]:  # type: ignore[override]
        return self._call(store.ack, queue, receipts)

    acks_with_receive = True

    def ack_receive(  # type: ignore[override]
        self, queue: str, receipts: list[str], max_messages: int, visibility_timeout: float | None
    ) -> asyncio.Future[tuple[list[str], list[Received]]]:
        """Both in one transaction: one commit where an ack and a receive made two."""
        return self._call(store.ack_receive, queue, receipts, max_messages, visibility_timeout)

    async def nack(self, queue: str, receipt: str, delay: float, error: str | None = None) -> None:
        await self._call(store.nack, queue, receipt, delay, error)

    async def extend(self, queue: str, receipts: list[str], seconds: float) -> list[str]:
        return await self._call(store.extend, queue, receipts, seconds)

    async def release(self, queue: str, receipts: list[str]) -> list[str]:
        return await self._call(store.release, queue, receipts)

    async def dead_letter(self, queue: str, receipt: str, reason: str) -> None:
        await self._call(store.dead_letter, queue, receipt, reason)

    async def stats(self, queue: str) -> QueueStats:
        return await self._call(store.stats, queue)

    async def purge(self, queue: str) -> int:
        return await self._call(store.purge, queue)

    async def peek(self, queue: str, limit: int) -> list[Received]:
        return await self._call(store.peek, queue, limit)

    async def redrive(self, queue: str, to: str | None, limit: int | None) -> int:
        # each chunk is one transaction: a message is moved whole or not at all
        moved = 0
        after = 0
        while limit is None or moved < limit:
            chunk = _REDRIVE_CHUNK if limit is None else min(_REDRIVE_CHUNK, limit - moved)
            n, last = await self._call(store.redrive, queue, to, chunk, after)
            moved += n
            if last is None:
                break
            after = last
        return moved

    # -- topics ----------------------------------------------------------------------------
    async def declare_topic(self, name: str, config: TopicConfig) -> None:
        await self._call(topics.declare_topic, name, config)

    async def topic_config(self, name: str) -> TopicConfig:
        return await self._call(topics.topic_config, name)

    async def delete_topic(self, name: str) -> bool:
        return await self._call(topics.delete_topic, name)

    async def list_topics(self, prefix: str = "") -> list[str]:
        return await self._call(Txn.names, "fairq_topics", prefix)

    async def subscribe(self, subscription: Subscription, config: QueueConfig) -> None:
        await self._call(topics.subscribe, subscription, config)

    async def unsubscribe(self, topic: str, name: str) -> bool:
        return await self._call(topics.unsubscribe, topic, name)

    async def subscriptions(self, topic: str) -> list[Subscription]:
        return await self._call(topics.subscriptions, topic)

    async def publish(self, topic: str, envelopes: list[Envelope]) -> list[PublishResult]:
        return await self._call(topics.publish, topic, envelopes)

    async def topic_stats(self, topic: str) -> TopicStats:
        return await self._call(topics.topic_stats, topic)

    def listen_scope(self) -> Hashable:
        return self._scope

    # -- attention -------------------------------------------------------------------------
    async def declare_attention(self, domain: str, config: AttentionConfig) -> None:
        await self._call(attention.declare_attention, domain, config)

    async def attention_config(self, domain: str) -> AttentionConfig:
        return await self._call(attention.attention_config, domain)

    async def list_attention(self, prefix: str = "") -> list[str]:
        return await self._call(Txn.names, "fairq_att_domains", prefix)

    async def delete_attention(self, domain: str) -> bool:
        return await self._call(attention.delete_attention, domain)

    async def attention_publish(
        self, domain: str, key: str, envelopes: list[Envelope]
    ) -> list[str]:
        return await self._call(attention.publish, domain, key, envelopes)

    async def attention_take(self, domain: str) -> Slice | None:
        return await self._call(attention.take, domain)

    async def attention_receive(
        self, domain: str, token: str, n: int, visibility_timeout: float | None
    ) -> tuple[list[Received], float | None]:
        return await self._call(attention.receive, domain, token, n, visibility_timeout)

    async def attention_extend(self, domain: str, token: str) -> bool:
        return await self._call(attention.extend, domain, token)

    async def attention_end(
        self, domain: str, token: str, processed: int, retry_at: float | None
    ) -> None:
        await self._call(attention.end, domain, token, processed, retry_at)

    async def attention_progress(
        self, domain: str, token: str, key: str, queue: str, receipts: list[str]
    ) -> list[str]:
        return await self._call(attention.progress, domain, token, key, queue, receipts)

    async def attention_count(self, domain: str, token: str, key: str, n: int) -> None:
        await self._call(attention.count, domain, token, key, n)

    async def attention_set_resource(
        self, domain: str, key: str, plan: str | None, state: str | None, tenant: str | None
    ) -> None:
        await self._call(attention.set_resource, domain, key, plan, state, tenant)

    async def attention_stats(self, domain: str) -> AttentionStats:
        return await self._call(attention_stats.stats, domain)

    async def attention_key_stats(self, domain: str, top: int) -> list[KeyStats]:
        return await self._call(attention_stats.key_stats, domain, top)

    async def attention_reconcile(self, domain: str) -> int:
        return await self._call(attention.reconcile, domain)

    async def attention_tenant_stats(self, domain: str, top: int) -> list[TenantStats]:
        return await self._call(attention_stats.tenant_stats, domain, top)

    async def attention_next(self, domain: str) -> SignalHint:
        conn = self._writer.conn
        if conn is None:
            raise BackendError("the sqlite backend is closed")
        try:
            return attention_stats.hint(conn, domain)
        except sqlite3.Error as exc:
            raise BackendError(f"sqlite: {exc}") from exc

    def attention_scheduled_here(self, domain: str, due: float) -> bool:
        # the writer's connection remembers the delayed signals it wrote (txn.Store)
        return due in self._writer._store.scheduled.get(domain, {})

    # -- idempotency -----------------------------------------------------------------------
    async def claim(
        self, namespace: str, key: str, token: str, lease: float, fingerprint: str | None
    ) -> IdempotencyRecord | None:
        return await self._call(idempotency.claim, namespace, key, token, lease, fingerprint)

    async def complete_claim(
        self, namespace: str, key: str, token: str, result: bytes | None, ttl: float
    ) -> bool:
        return await self._call(idempotency.complete_claim, namespace, key, token, result, ttl)

    async def release_claim(self, namespace: str, key: str, token: str) -> bool:
        return await self._call(idempotency.release_claim, namespace, key, token)

    async def extend_claim(self, namespace: str, key: str, token: str, lease: float) -> bool:
        return await self._call(idempotency.extend_claim, namespace, key, token, lease)

    async def idempotency_record(self, namespace: str, key: str) -> IdempotencyRecord | None:
        return await self._call(idempotency.idempotency_record, namespace, key)

    async def forget_claim(self, namespace: str, key: str) -> bool:
        return await self._call(idempotency.forget_claim, namespace, key)

    async def advance_version(self, namespace: str, entity: str, version: Version) -> bool:
        return await self._call(idempotency.advance_version, namespace, entity, version)

    async def current_version(self, namespace: str, entity: str) -> Version | None:
        return await self._call(idempotency.current_version, namespace, entity)

    # -- waiting rooms ---------------------------------------------------------------------
    async def declare_room(
        self,
        room: str,
        options: Mapping[str, object],
        secret_kid: str | None,
        seed: bytes,
        seed_kid: str,
    ) -> RoomRecord:
        return await self._call(
            waitingroom.declare_room, room, dict(options), secret_kid, seed, seed_kid
        )

    async def room_record(self, room: str) -> RoomRecord:
        return await self._call(waitingroom.room_record, room)

    async def list_rooms(self, prefix: str = "") -> list[str]:
        return await self._call(Txn.names, "fairq_rooms", prefix)

    async def delete_room(self, room: str) -> bool:
        return await self._call(waitingroom.delete_room, room)

    async def room_join(self, room: str, fans: list[str]) -> list[Place]:
        return await self._call(waitingroom.join, room, fans)

    async def room_status(self, room: str, seq: int) -> Place:
        return await self._call(waitingroom.status, room, seq)

    async def room_tick(self, room: str, holder: str, lease: float) -> TickResult:
        return await self._call(waitingroom.tick, room, holder, lease)

    async def room_release_admitter(self, room: str, holder: str) -> bool:
        return await self._call(waitingroom.release_admitter, room, holder)

    async def room_admit(self, room: str, n: int) -> int:
        return await self._call(waitingroom.admit, room, n)

    async def room_set_rate(self, room: str, rate: float) -> None:
        await self._call(waitingroom.set_rate, room, rate)

    async def room_consume(self, room: str, seq: int) -> str:
        return await self._call(waitingroom.consume, room, seq)

    async def room_sold_out(self, room: str) -> int:
        return await self._call(waitingroom.sold_out, room)

    async def room_close(self, room: str) -> None:
        await self._call(waitingroom.close, room)

    async def room_stats(self, room: str) -> RoomStats:
        return await self._call(waitingroom.stats, room)

    # -- counters for other engines ----------------------------------------------------------
    async def add_counts(self, scope: str, counts: Mapping[str, int]) -> None:
        if any(counts.values()):
            await self._call(idempotency.add_counts, scope, dict(counts))

    async def read_counts(self, scope: str) -> dict[str, int]:
        return await self._call(idempotency.read_counts, scope)

    async def drop_counts(self, scope: str) -> None:
        await self._call(idempotency.drop_counts, scope)

    # -- wake-ups --------------------------------------------------------------------------
    async def next_due(self) -> float | None:
        conn = self._writer.conn
        if conn is None:
            return None
        try:
            # attention takers wait for their domain's own due times (attention_next), so
            # a delayed signal coming due wakes one taker, not every waiter of the process
            due = messages.next_due(conn) or None
        except sqlite3.Error as exc:
            raise BackendError(f"sqlite: {exc}") from exc
        if due is not None and due <= self.clock.now() and self._swept_due != due:
            # something is due that only a write transaction moves on (a lease of a process
            # that died, a row acked elsewhere and not settled yet): sweep once, or nothing
            # changes until some process writes, and the pulse would wake every waiter in a
            # loop (an idle attention taker only reads); the due time is still handed back
            self._swept_due = due
            with contextlib.suppress(FairqError):
                await self._call(_swept)
        return due

    def watch(self, poke: Callable[[], None]) -> bool:
        watch = self._watch
        if watch is None:
            if self._writer.conn is None:
                return False
            watch = WalWatch.open(self.path)
            if watch is None:
                return False
            self._watch = watch
        elif not self._watching and not watch.drain():
            # what came while nobody read is stale (the pulse checks data_version anyway);
            # a watch that is gone and cannot be placed again: poll instead
            self._drop_watch()
            return False
        if not self._watching:
            asyncio.get_running_loop().add_reader(watch.fd, self._on_wal_write)
            self._watching = True
        self._poke = poke
        return True

    def watching(self) -> bool:
        return self._watching

    def unwatch(self) -> None:
        """Stop reading the watch until the next :meth:`watch`, but keep its descriptor:
        closing an inotify descriptor waits for the kernel's RCU grace period (10-25 ms
        measured here, the whole event loop blocked in ``close``), and a worker's pulse
        stops and starts again every time its queue runs empty."""
        self._poke = None
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        if self._watching and self._watch is not None:
            self._watching = False
            with contextlib.suppress(RuntimeError):  # the loop may be closed already
                asyncio.get_running_loop().remove_reader(self._watch.fd)

    def _drop_watch(self) -> None:
        """Close the watch for good (the backend closes, or the WAL file cannot be watched)."""
        self.unwatch()
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()

    def _on_wal_write(self) -> None:
        watch = self._watch
        if watch is None:
            return
        if not watch.drain():
            self._drop_watch()  # the pulse notices (watching() is False) and polls again
            return
        self._rechecks = len(RECHECKS)
        if self._poke is not None:
            self._poke()

    def _look_again(self) -> None:
        self._recheck = None
        if self._poke is not None:
            self._poke()

    async def changed_elsewhere(self) -> bool:
        if self._writer.conn is None:
            return False
        conn = self._writer.conn
        try:
            (version,) = conn.execute("PRAGMA data_version").fetchone()
            own = self._writer.commits
            if version == self._pulse_version and self._rechecks and own == self._own_commits:
                # a WAL write, and not ours: another process is between writing its frames
                # and publishing its commit, which takes it some microseconds; wait for it
                # here rather than by a timer, whose wake-up a busy machine may delay by a
                # scheduler slice
                until = time.perf_counter() + _SPIN
                while version == self._pulse_version and time.perf_counter() < until:
                    (version,) = conn.execute("PRAGMA data_version").fetchone()
            self._own_commits = own
        except sqlite3.Error as exc:
            raise BackendError(f"sqlite: {exc}") from exc
        if version != self._pulse_version:
            self._pulse_version = version
            self._rechecks = 0
            return True
        if self._rechecks and self._recheck is None:
            # a WAL write without a new commit yet: another process may be between writing
            # its frames and publishing them, so look again in a moment
            delay = RECHECKS[len(RECHECKS) - self._rechecks]
            self._rechecks -= 1
            self._recheck = asyncio.get_running_loop().call_later(delay, self._look_again)
        return False
