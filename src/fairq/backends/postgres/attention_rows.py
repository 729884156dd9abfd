"""PostgreSQL attention, the shared pieces: one transaction's context (:class:`Txn`, run
by :func:`run`), the domain and key rows, signals and the tenants' ready counts, and the
due times of the delayed signals this broker wrote (:class:`Scheduled`).

The slice cycle and the scheduler are in :mod:`.attention`, resources and stats in
:mod:`.attention_keys`; the tables in ``migrations/0005_attention.sql`` and
``0008_attention_worker_time.sql``, the one-statement take and end in
``0010_attention_one_call.sql`` (TABLES.md). Locks: a publish locks its key's row;
takes, ends, set_resource, stats and the reconciler lock the domain's row first (one
scheduler decision at a time per domain), then key rows before tenant rows, the same
order as a publish, so the two cannot deadlock on each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...errors import AttentionNotFound
from ...model.attention import AttentionConfig, Plan
from ..attention_policy import KeyRow, KeyView, refill
from .connection import Cursor

if TYPE_CHECKING:
    from . import PostgresBackend

__all__ = [
    "KEY_COLS",
    "Domain",
    "Key",
    "Scheduled",
    "Txn",
    "count",
    "domain_row",
    "key_row",
    "load_key",
    "note_backlog",
    "plan_of",
    "run",
    "signal",
    "tenant_ready",
    "view",
]

KEY_COLS = (
    "key, queue, tenant, plan, state, parked, pending, active, tokens, tokens_at, backlog_since"
)
_SCHEDULED_KEPT = 1000  # due times remembered per domain before old ones are forgotten


class Scheduled:
    """The due times of the delayed signals this broker wrote, per domain: it takes those
    on time, brokers in other processes a moment later (``Attention._take``), so a due
    signal costs one take attempt, not one per process."""

    def __init__(self) -> None:
        self.by_domain: dict[str, dict[float, None]] = {}

    def add(self, domain: str, dues: list[float], now: float) -> None:
        kept = self.by_domain.setdefault(domain, {})
        for due in dues:
            kept[due] = None
        if len(kept) > _SCHEDULED_KEPT:  # forget what came due long ago
            for old in [x for x in kept if x < now - 60.0]:
                del kept[old]

    def __contains__(self, item: tuple[str, float]) -> bool:
        domain, due = item
        return due in self.by_domain.get(domain, {})


@dataclass(slots=True)
class Txn:
    """One attention transaction: its cursor, the broker, its ``now``, the domains whose
    takers it must wake, the delayed signals it wrote (domain -> due times), and whether
    its commit waits for the WAL flush."""

    cur: Cursor
    b: PostgresBackend
    now: float
    notify: set[str] = field(default_factory=set)
    scheduled: dict[str, list[float]] = field(default_factory=dict)
    flush: bool = True  # commit waits for the WAL flush (see run)

    @property
    def s(self) -> str:
        return self.b.s


@dataclass(slots=True)
class Domain:
    id: int
    name: str
    config: AttentionConfig


class Key(KeyRow):
    """A key's row, written back with :meth:`save`."""

    __slots__ = ()

    async def save(self, t: Txn, d: Domain, processed: int = 0) -> None:
        await t.cur.execute(
            f"UPDATE {t.s}.att_keys SET tenant = %s, plan = %s, state = %s, parked = %s, "
            "pending = %s, active = %s, tokens = %s, tokens_at = %s, backlog_since = %s, "
            "processed = processed + %s WHERE domain_id = %s AND key = %s",
            (
                self.tenant,
                self.plan,
                self.state,
                bool(self.parked),
                self.pending,
                self.active,
                None if self.tokens == math.inf else self.tokens,
                self.tokens_at,
                self.backlog_since,
                processed,
                d.id,
                self.key,
            ),
        )


async def run(
    b: PostgresBackend,
    fn: Any,
    connection: object | None = None,
    flush: bool = True,
    wakes: bool = True,
) -> Any:
    """``fn(txn)`` in one transaction (retried whole on a deadlock); then the wake-ups.

    ``flush=False`` (takes, extends and ends of slices: their concurrency tokens are
    leases, like a receive's, see ``receive()`` in 0001_queues.sql) commits without waiting
    for the WAL flush (``synchronous_commit = off`` for this transaction only, unless
    ``?durable_leases=on``; ``fn`` sets it, in its first statement, where it reads
    ``txn.flush``): those steps hold a worker while they commit. A crash of the
    server can undo only such a step with no synchronous commit after it (a later one
    flushes the WAL before it), and undoing one loses nothing: an undone take leaves its
    signal where it was (the worker's next receive finds its slice gone), an undone end
    leaves the slice to expire and be re-signalled. Publishes, acks and resource changes
    keep the full flush. ``wakes=False`` (a slice's receive, as a queue's): no NOTIFY
    to send after the commit."""
    now = b.now()
    notify: set[str] = set()
    scheduled: dict[str, list[float]] = {}

    async def go(cur: Cursor) -> Any:
        t = Txn(cur, b, now)
        t.flush = flush or connection is not None or b.options.durable_leases
        result = await fn(t)
        for domain in t.notify:
            await cur.execute(f"SELECT {b.s}.wake(%s)", ("a:" + domain,))
        notify.clear()
        notify.update(t.notify)
        scheduled.clear()
        scheduled.update(t.scheduled)
        return result

    result = await b.pool.run(go, transaction=True, connection=connection, wakes=wakes)
    for domain, dues in scheduled.items():
        b.att_scheduled.add(domain, dues, now)
    if connection is None and notify:
        b.wakeups.notify([f"attention:{d}" for d in notify])
    return result


async def domain_row(t: Txn, name: str) -> Domain:
    """The domain's row, not locked (the steps that decide lock it: ``attention.begin``)."""
    await t.cur.execute(f"SELECT id, config FROM {t.s}.att_domains WHERE name = %s", (name,))
    row = await t.cur.fetchone()
    if row is None:
        raise AttentionNotFound(name)
    return Domain(row[0], name, AttentionConfig.from_dict(row[1]))


async def load_key(t: Txn, d: Domain, key: str) -> Key | None:
    """The key's row, locked for this transaction (None: no such key)."""
    await t.cur.execute(
        f"SELECT {KEY_COLS} FROM {t.s}.att_keys WHERE domain_id = %s AND key = %s FOR UPDATE",
        (d.id, key),
    )
    row = await t.cur.fetchone()
    return None if row is None else Key(row)


async def key_row(t: Txn, d: Domain, key: str) -> Key:
    """The key's row, locked; made with the domain's defaults if it is new."""
    k = await load_key(t, d, key)
    if k is None:
        await t.cur.execute(
            f"INSERT INTO {t.s}.att_keys (domain_id, key, queue, tenant, plan, tokens_at) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (d.id, key, d.config.queue_for(d.name, key), key, d.config.default_plan, t.now),
        )
        k = await load_key(t, d, key)
        assert k is not None
    return k


def plan_of(d: Domain, k: Key) -> Plan:
    return d.config.plans.get(k.plan) or d.config.plans[d.config.default_plan]


async def count(t: Txn, d: Domain, counter: str, n: int = 1) -> None:
    if n:
        await t.cur.execute(
            f"UPDATE {t.s}.att_domains SET {counter} = {counter} + %s WHERE id = %s", (n, d.id)
        )


async def view(t: Txn, d: Domain, k: Key) -> KeyView:
    """The key as the policy sees it, its work queue read by ``att_view``."""
    plan = plan_of(d, k)
    await t.cur.execute(
        f"SELECT * FROM {t.s}.att_view(%s, %s, %s)", (k.queue, t.now, plan.max_messages + 1)
    )
    row = await t.cur.fetchone()
    assert row is not None
    visible = int(row[0] or 0)
    waiting_due = None if visible or row[1] is None else float(row[1])
    tokens = refill(k.tokens, k.tokens_at, t.now, plan)
    return KeyView(k.state, k.active, k.pending, visible, waiting_due, tokens)


async def signal(t: Txn, d: Domain, k: Key, due: float) -> None:
    """A signal for ``k`` at the tail of its tenant, or delayed until ``due``."""
    ready = due <= t.now
    await t.cur.execute(
        f"INSERT INTO {t.s}.att_signals (domain_id, tenant, key, due, ready) "
        "VALUES (%s, %s, %s, %s, %s) RETURNING id",
        (d.id, k.tenant, k.key, due, ready),
    )
    row = await t.cur.fetchone()
    assert row is not None
    k.pending += 1
    if ready:
        await tenant_ready(t, d, k.tenant, int(row[0]), 1)
    else:
        t.scheduled.setdefault(d.name, []).append(due)
    t.notify.add(d.name)


async def tenant_ready(t: Txn, d: Domain, tenant: str, signal_id: int, n: int) -> None:
    """``n`` more ready signals for ``tenant`` (``att_ready``: eligible_vt on 0 -> n)."""
    await t.cur.execute(f"SELECT {t.s}.att_ready(%s, %s, %s, %s)", (d.id, tenant, signal_id, n))


async def note_backlog(t: Txn, d: Domain, k: Key, has_backlog: bool) -> None:
    """Track when the key's backlog started, and count its clear time when it ends."""
    if has_backlog and k.backlog_since is None:
        k.backlog_since = t.now
    elif not has_backlog and k.backlog_since is not None:
        await t.cur.execute(
            f"UPDATE {t.s}.att_domains SET clear_sum = clear_sum + %s, "
            "clear_count = clear_count + 1 WHERE id = %s",
            (t.now - k.backlog_since, d.id),
        )
        k.backlog_since = None
