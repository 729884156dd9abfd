"""The PostgreSQL backend's queue operations: each one statement (a PL/pgSQL function of
``migrations/0001_queues.sql``) or one short transaction, on a cursor the backend gives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from operator import itemgetter
from typing import Any

import orjson

from ...errors import LeaseLost
from ...message import (
    Received,
    format_id,
    id_time,
    make_receipt,
    parse_receipt,
    storable_lease,
)
from ...model.queues import Envelope, QueueConfig, QueueStats
from .connection import Cursor
from .queries import Queries

__all__ = ["declare_queue", "delete_queue", "envelope_arrays", "receipts_arrays"]

_QUEUE_COLUMNS = (
    "visibility_timeout, max_attempts, dead_letter, retention, max_length, overflow, fifo, "
    "max_priority, dedup_window"
)


def _columns(config: QueueConfig) -> tuple[Any, ...]:
    return (
        config.visibility_timeout,
        config.max_attempts,
        config.dead_letter,
        config.retention,
        config.max_length,
        config.overflow,
        config.fifo,
        config.max_priority,
        config.dedup_window,
    )


def attrs_json(attrs: dict[str, str]) -> str | None:
    return orjson.dumps(attrs).decode() if attrs else None


def envelope_arrays(
    envs: list[Envelope],
) -> tuple[
    list[bytes],
    list[str | None] | None,
    list[float] | None,
    list[int] | None,
    list[str | None] | None,
    list[str | None] | None,
]:
    """The columns of a send as arrays; None for a column that is empty in every message
    (the common case costs no bytes on the wire)."""
    bodies = [e.body for e in envs]
    attrs = [attrs_json(e.attributes) for e in envs] if any(e.attributes for e in envs) else None
    delays = [e.delay for e in envs] if any(e.delay for e in envs) else None
    prios = [e.priority for e in envs] if any(e.priority for e in envs) else None
    groups = [e.group for e in envs] if any(e.group is not None for e in envs) else None
    dedups = [e.dedup_id for e in envs] if any(e.dedup_id is not None for e in envs) else None
    return bodies, attrs, delays, prios, groups, dedups


def receipts_arrays(receipts: list[str]) -> tuple[list[int], list[int]]:
    ids, leases = [], []
    for r in receipts:
        mid, lease = parse_receipt(r)
        ids.append(mid)
        leases.append(storable_lease(lease))
    return ids, leases


def receipts_literals(receipts: list[str]) -> tuple[str, str]:
    """The message ids and lease tokens of ``receipts`` as two ``bigint[]`` literals (one
    string each: cheaper to send than psycopg's element-by-element array dump)."""
    ids, leases = receipts_arrays(receipts)
    return "{" + ",".join(map(str, ids)) + "}", "{" + ",".join(map(str, leases)) + "}"


def received(row: tuple[Any, ...], queue: str, key: str | None = None) -> Received:
    mid, body, attrs, attempt, priority, grp, lease = row[:7]
    return Received(
        format_id(mid),
        bytes(body),
        orjson.loads(attrs) if attrs else {},
        attempt,
        id_time(mid),
        priority,
        grp,
        make_receipt(mid, lease) if lease is not None else "",
        queue,
        key,
    )


def received_rows(rows: list[tuple[Any, ...]], queue: str) -> list[Received]:
    """:func:`received` of every row of a receive (id, body, attrs, attempt, priority,
    grp, lease, ord), in delivery order; the hot path of a drain, so done in one loop."""
    rows.sort(key=_by_ord)
    return [
        Received(
            format_id(mid),
            body if type(body) is bytes else bytes(body),
            orjson.loads(attrs) if attrs else {},
            attempt,
            id_time(mid),
            priority,
            grp,
            make_receipt(mid, lease),
            queue,
        )
        for mid, body, attrs, attempt, priority, grp, lease, _ in rows
    ]


_by_ord = itemgetter(7)


def stats_of(row: tuple[Any, ...], config: QueueConfig) -> QueueStats:
    visible, delayed, in_flight, oldest, sent, acked, nacked, again, dead, expired, gone = row
    slo = config.freshness_slo
    return QueueStats(
        visible=int(visible),
        delayed=int(delayed),
        in_flight=int(in_flight),
        oldest_age=float(oldest),
        sent=int(sent),
        acked=int(acked),
        nacked=int(nacked),
        redelivered=int(again),
        dead_lettered=int(dead),
        expired=int(expired),
        discarded=int(gone),
        freshness_slo=slo,
        breaching=slo is not None and float(oldest) > slo,
    )


def lost_of(positions: list[int] | None, receipts: list[str]) -> list[str]:
    return [receipts[i - 1] for i in positions or ()]


async def declare_queue(cur: Cursor, s: str, name: str, config: QueueConfig, now: float) -> None:
    """Create the queue or update its options, and its dead-letter queue, in the caller's
    transaction."""
    await cur.execute(f"SELECT id, config FROM {s}.queues WHERE name = %s FOR UPDATE", (name,))
    row = await cur.fetchone()
    data = orjson.dumps(config.to_dict()).decode()
    if row is None:
        await cur.execute(
            f"INSERT INTO {s}.queues (name, config, created_at, {_QUEUE_COLUMNS}) "
            "VALUES (%s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (name) DO NOTHING RETURNING id",
            (name, data, now, *_columns(config)),
        )
        if await cur.fetchone() is None:  # declared meanwhile by someone else
            await cur.execute(
                f"SELECT id, config FROM {s}.queues WHERE name = %s FOR UPDATE", (name,)
            )
            row = await cur.fetchone()
    if row is not None:
        old = QueueConfig.from_dict(row[1])
        old.check_change(name, config)
        if old != config:
            sets = ", ".join(f"{c.strip()} = %s" for c in _QUEUE_COLUMNS.split(","))
            await cur.execute(
                f"UPDATE {s}.queues SET config = %s::jsonb, {sets} WHERE id = %s",
                (data, *_columns(config), row[0]),
            )
    if config.dead_letter is not None:
        dlq = QueueConfig.for_dead_letters()
        await cur.execute(
            f"INSERT INTO {s}.queues (name, config, created_at, {_QUEUE_COLUMNS}) "
            "VALUES (%s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (name) DO NOTHING",
            (config.dead_letter, orjson.dumps(dlq.to_dict()).decode(), now, *_columns(dlq)),
        )


async def delete_queue(cur: Cursor, s: str, name: str) -> bool:
    await cur.execute(f"SELECT id FROM {s}.queues WHERE name = %s FOR UPDATE", (name,))
    row = await cur.fetchone()
    if row is None:
        return False
    qid = row[0]
    await cur.execute(
        f"UPDATE {s}.topics SET version = version + 1 WHERE id IN "
        f"(SELECT topic_id FROM {s}.subscriptions WHERE queue_id = %s)",
        (qid,),
    )
    for table in ("messages", "leases", "fifo_groups", "dedup", "counts", "subscriptions"):
        await cur.execute(
            f"DELETE FROM {s}.{table} WHERE queue_id = %s",
            (qid,),
        )
    await cur.execute(f"DELETE FROM {s}.queues WHERE id = %s", (qid,))
    await cur.execute(f"SELECT {s}.wake(%s)", ("q:" + name,))
    return True


async def queue_config(cur: Cursor, q: Queries, name: str) -> QueueConfig | None:
    await cur.execute(q.queue_row, (name,))
    row = await cur.fetchone()
    return None if row is None else QueueConfig.from_dict(row[1])


class AckCoalescer:
    """Acks of one queue asked for during one pass of the event loop go out as ONE ack
    statement (a worker's handlers finishing together cost one round trip, not one each);
    each caller still learns which of its own receipts were lost. A receipt asked twice in
    one pass goes in a second statement, so the second ack of it is lost, as it must be."""

    def __init__(self, flush: Callable[[str, list[str]], Awaitable[list[str]]]) -> None:
        self._flush = flush
        self._pending: dict[str, list[tuple[list[str], asyncio.Future[list[str]]]]] = {}
        self._running: set[asyncio.Future[None]] = set()

    async def ack(self, queue: str, receipts: list[str]) -> list[str]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[str]] = loop.create_future()
        waiting = self._pending.get(queue)
        if waiting is None:
            waiting = self._pending[queue] = []
            loop.call_soon(self._start, queue)
        waiting.append((receipts, fut))
        return await fut

    def _start(self, queue: str) -> None:
        jobs = self._pending.pop(queue, [])
        if jobs:
            task = asyncio.ensure_future(self._run(queue, jobs))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run(
        self, queue: str, jobs: list[tuple[list[str], asyncio.Future[list[str]]]]
    ) -> None:
        while jobs:
            batch: list[tuple[list[str], asyncio.Future[list[str]]]] = []
            seen: set[str] = set()
            rest = []
            for receipts, fut in jobs:
                if seen.isdisjoint(receipts):
                    batch.append((receipts, fut))
                    seen.update(receipts)
                else:
                    rest.append((receipts, fut))
            jobs = rest
            try:
                lost = set(await self._flush(queue, [r for rs, _ in batch for r in rs]))
            except BaseException as exc:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for receipts, fut in batch:
                if not fut.done():
                    fut.set_result([r for r in receipts if r in lost])


def lease_lost(receipt: str) -> LeaseLost:
    return LeaseLost([receipt])
