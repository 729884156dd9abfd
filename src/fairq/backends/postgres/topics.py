"""The PostgreSQL backend's topics, each operation one transaction.

A publish holds its topic's row ``FOR SHARE`` (a subscribe takes it ``FOR UPDATE`` and
bumps ``version``), matches every message against the subscriptions in Python (the
:class:`SubscriptionIndex`, cached per topic version), then stores all copies of all
messages in ONE call of ``publish_copies`` — every subscription or none. A repeated
``dedup_id`` is claimed with ``INSERT ... ON CONFLICT ... WHERE expired``, so of two
concurrent publishes of one id exactly one stores copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ...errors import ConfigConflict, TopicNotFound
from ...model.queues import Envelope, QueueConfig
from ...model.topics import (
    PublishResult,
    Subscription,
    SubscriptionIndex,
    TopicConfig,
    TopicStats,
)
from ..rules import plan_dedup, publish_plan, publish_results
from . import queues
from .connection import Cursor
from .listener import _MAX_PAYLOAD, encode_broadcast

if TYPE_CHECKING:
    from . import PostgresBackend

__all__ = ["TopicCache"]


@dataclass(slots=True)
class _Topic:
    id: int
    version: int
    config: TopicConfig
    subs: dict[str, Subscription]
    index: SubscriptionIndex = field(init=False)

    def __post_init__(self) -> None:
        self.index = SubscriptionIndex(self.subs.values())


class TopicCache:
    """Topics as last read, by name; trusted only while their version is unchanged."""

    def __init__(self) -> None:
        self.by_name: dict[str, _Topic] = {}

    def clear(self) -> None:
        self.by_name.clear()


async def names(cur: Cursor, s: str, table: str, prefix: str) -> list[str]:
    await cur.execute(
        f"SELECT name FROM {s}.{table} WHERE left(name, length(%s)) = %s ORDER BY name",
        (prefix, prefix),
    )
    return [r[0] for r in await cur.fetchall()]


async def _load(cur: Cursor, s: str, tid: int, version: int, config: Any) -> _Topic:
    await cur.execute(
        f"SELECT t.name, s.name, q.name, s.filter, s.routing, s.push FROM {s}.subscriptions s "
        f"JOIN {s}.queues q ON q.id = s.queue_id JOIN {s}.topics t ON t.id = s.topic_id "
        "WHERE s.topic_id = %s",
        (tid,),
    )
    subs = {r[1]: Subscription(r[0], r[1], r[2], r[3], r[4], r[5]) for r in await cur.fetchall()}
    return _Topic(tid, version, TopicConfig(**config), subs)


async def _topic(cur: Cursor, s: str, name: str, lock: str = "") -> tuple[int, int, Any]:
    await cur.execute(f"SELECT id, version, config FROM {s}.topics WHERE name = %s {lock}", (name,))
    row = await cur.fetchone()
    if row is None:
        raise TopicNotFound(name)
    return row[0], row[1], row[2]


async def declare_topic(cur: Cursor, s: str, name: str, config: TopicConfig, now: float) -> None:
    data = orjson.dumps({"dedup_window": config.dedup_window}).decode()
    await cur.execute(
        f"INSERT INTO {s}.topics (name, config, created_at) VALUES (%s, %s::jsonb, %s) "
        "ON CONFLICT (name) DO UPDATE SET config = excluded.config "
        f"WHERE {s}.topics.config IS DISTINCT FROM excluded.config",
        (name, data, now),
    )


async def topic_config(cur: Cursor, s: str, name: str) -> TopicConfig:
    _, _, config = await _topic(cur, s, name)
    return TopicConfig(**config)


async def delete_topic(cur: Cursor, s: str, name: str) -> bool:
    await cur.execute(f"SELECT id FROM {s}.topics WHERE name = %s FOR UPDATE", (name,))
    row = await cur.fetchone()
    if row is None:
        return False
    tid = row[0]
    await cur.execute(
        f"SELECT q.name FROM {s}.subscriptions s JOIN {s}.queues q ON q.id = s.queue_id "
        "WHERE s.topic_id = %s",
        (tid,),
    )
    for (qname,) in await cur.fetchall():
        await queues.delete_queue(cur, s, qname)
    for table in ("topic_dedup", "topic_counts", "subscriptions"):
        await cur.execute(f"DELETE FROM {s}.{table} WHERE topic_id = %s", (tid,))
    await cur.execute(f"DELETE FROM {s}.topics WHERE id = %s", (tid,))
    return True


async def subscribe(
    cur: Cursor, s: str, sub: Subscription, config: QueueConfig, now: float
) -> None:
    tid, _, _ = await _topic(cur, s, sub.topic, "FOR UPDATE")
    await cur.execute(
        f"SELECT 1 FROM {s}.subscriptions WHERE topic_id = %s AND name = %s", (tid, sub.name)
    )
    exists = await cur.fetchone() is not None
    if not exists:
        await cur.execute(f"SELECT 1 FROM {s}.queues WHERE name = %s", (sub.queue,))
        if await cur.fetchone() is not None:
            raise ConfigConflict(
                f"queue {sub.queue!r} already exists and is not the queue of subscription "
                f"{sub.name!r}"
            )
    await queues.declare_queue(cur, s, sub.queue, config, now)
    await cur.execute(
        f"INSERT INTO {s}.subscriptions (topic_id, name, queue_id, filter, routing, push, "
        f"created_at) SELECT %s, %s, id, %s::jsonb, %s, %s, %s FROM {s}.queues WHERE name = %s "
        "ON CONFLICT (topic_id, name) DO UPDATE SET queue_id = excluded.queue_id, "
        "filter = excluded.filter, routing = excluded.routing, push = excluded.push",
        (
            tid,
            sub.name,
            None if sub.filter is None else orjson.dumps(sub.filter).decode(),
            sub.routing,
            sub.push,
            now,
            sub.queue,
        ),
    )
    await cur.execute(f"UPDATE {s}.topics SET version = version + 1 WHERE id = %s", (tid,))


async def unsubscribe(cur: Cursor, s: str, topic: str, name: str) -> bool:
    tid, _, _ = await _topic(cur, s, topic, "FOR UPDATE")
    await cur.execute(
        f"SELECT q.name FROM {s}.subscriptions s JOIN {s}.queues q ON q.id = s.queue_id "
        "WHERE s.topic_id = %s AND s.name = %s",
        (tid, name),
    )
    row = await cur.fetchone()
    if row is None:
        return False
    await queues.delete_queue(cur, s, row[0])  # also removes the subscription row
    await cur.execute(
        f"DELETE FROM {s}.subscriptions WHERE topic_id = %s AND name = %s", (tid, name)
    )
    return True


async def subscriptions(cur: Cursor, s: str, topic: str) -> list[Subscription]:
    tid, version, config = await _topic(cur, s, topic)
    t = await _load(cur, s, tid, version, config)
    return [t.subs[n] for n in sorted(t.subs)]


async def publish(
    cur: Cursor,
    backend: PostgresBackend,
    name: str,
    envs: list[Envelope],
    now: float,
    origin: str,
) -> tuple[list[PublishResult], set[str]]:
    s = backend.s
    cache = backend._topics.by_name
    tid, version, config = await _topic(cur, s, name, "FOR SHARE")
    t = cache.get(name)
    if t is None or t.id != tid or t.version != version:
        t = cache[name] = await _load(cur, s, tid, version, config)
    earlier: dict[int, list[str]] = {}
    claimed: set[str] = set()
    dedup_ids = list(dict.fromkeys(e.dedup_id for e in envs if e.dedup_id is not None))
    window = t.config.dedup_window
    if dedup_ids and window > 0:
        # claim every dedup id at once: ours if new or expired; else the first publish's
        await cur.execute(
            f"INSERT INTO {s}.topic_dedup AS d (topic_id, dedup_id, msg_id, subscriptions, "
            "expires_at) SELECT %s, x, 0, '[]'::jsonb, %s FROM unnest(%s::text[]) x "
            "ON CONFLICT (topic_id, dedup_id) DO UPDATE SET msg_id = 0, "
            "subscriptions = '[]'::jsonb, expires_at = excluded.expires_at "
            "WHERE d.expires_at <= %s RETURNING d.dedup_id",
            (tid, now + window, dedup_ids, now),
        )
        claimed = {r[0] for r in await cur.fetchall()}
        others = [d for d in dedup_ids if d not in claimed]
        found: dict[str, tuple[int, list[str]]] = {}
        if others:
            await cur.execute(
                f"SELECT dedup_id, msg_id, subscriptions FROM {s}.topic_dedup "
                "WHERE topic_id = %s AND dedup_id = ANY(%s::text[])",
                (tid, others),
            )
            found = {r[0]: (int(r[1]), list(r[2])) for r in await cur.fetchall()}

        def sent_before(dedup_id: str) -> int | None:
            hit = found.get(dedup_id)
            if hit is None:
                return None
            earlier[hit[0]] = hit[1]
            return hit[0]

        plan = plan_dedup(envs, sent_before)
    else:
        plan = plan_dedup(envs, lambda _: None)
    copy_plan = publish_plan(t.index, t.subs, plan.fresh)
    copies = copy_plan.copies
    qnames: list[str] = []
    pubs: list[int] = []
    for qname, indices in copy_plan.per_queue.items():
        qnames += [qname] * len(indices)
        pubs += [i + 1 for i in indices]
    bodies = [c.body for c in copies]
    attrs = [queues.attrs_json(c.attributes) for c in copies]
    delays = [c.delay for c in copies] if any(c.delay for c in copies) else None
    await cur.execute(
        backend.q.publish_copies, (now, len(copies), qnames, pubs, bodies, attrs, delays)
    )
    row = await cur.fetchone()
    made: list[int] = list(row[0]) if row and row[0] else []
    matched = copy_plan.matched
    if plan.first and claimed:
        rows = [
            (d, made[i], orjson.dumps(matched[i]).decode())
            for d, i in plan.first.items()
            if d in claimed
        ]
        await cur.executemany(
            f"UPDATE {s}.topic_dedup SET msg_id = %s, subscriptions = %s::jsonb "
            "WHERE topic_id = %s AND dedup_id = %s",
            [(mid, subs, tid, d) for d, mid, subs in rows],
        )
    n_copies = sum(len(x) for x in matched)
    unmatched = sum(1 for x in matched if not x)
    await cur.execute(
        f"INSERT INTO {s}.topic_counts AS c (topic_id, shard, published, copies, unmatched) "
        "VALUES (%s, pg_backend_pid() %% 64, %s, %s, %s) ON CONFLICT (topic_id, shard) DO UPDATE "
        "SET published = c.published + excluded.published, copies = c.copies + excluded.copies, "
        "unmatched = c.unmatched + excluded.unmatched",
        (tid, len(plan.fresh), n_copies, unmatched),
    )
    results = publish_results(plan, made, matched, earlier)
    await _broadcast(cur, backend, name, plan.fresh, made, now)
    return results, set(copy_plan.per_queue)


async def _broadcast(
    cur: Cursor,
    backend: PostgresBackend,
    topic: str,
    fresh: list[Envelope],
    made: list[int],
    now: float,
) -> None:
    """NOTIFY the messages to ephemeral listeners in other processes, if there are any."""
    if not fresh:
        return
    s = backend.s
    from ...message import format_id

    await cur.execute(
        f"SELECT 1 FROM {s}.listeners WHERE topic = %s AND until > %s LIMIT 1", (topic, now)
    )
    if await cur.fetchone() is None:
        return
    payload = encode_broadcast(topic, [(e, format_id(m)) for e, m in zip(fresh, made, strict=True)])
    if len(payload) <= _MAX_PAYLOAD:
        await cur.execute(f"SELECT {s}.wake(%s)", ("t:" + payload.decode(),))
        return
    await cur.execute(
        f"INSERT INTO {s}.broadcasts (at, payload) VALUES (%s, %s) RETURNING id", (now, payload)
    )
    row = await cur.fetchone()
    assert row is not None
    await cur.execute(f"SELECT {s}.wake(%s)", (f"b:{row[0]}",))


async def topic_stats(cur: Cursor, s: str, name: str) -> TopicStats:
    tid, _, _ = await _topic(cur, s, name)
    await cur.execute(
        "SELECT coalesce(sum(published), 0), coalesce(sum(copies), 0), "
        f"coalesce(sum(unmatched), 0), (SELECT count(*) FROM {s}.subscriptions "
        f"WHERE topic_id = %s) FROM {s}.topic_counts WHERE topic_id = %s",
        (tid, tid),
    )
    row = await cur.fetchone()
    assert row is not None
    return TopicStats(int(row[0]), int(row[1]), int(row[2]), int(row[3]))


async def renew_listeners(
    cur: Cursor, s: str, topics: list[str], session: str, until: float
) -> None:
    await cur.execute(
        f"INSERT INTO {s}.listeners (topic, session, until) SELECT x, %s, %s "
        "FROM unnest(%s::text[]) x ON CONFLICT (topic, session) DO UPDATE SET until = "
        "excluded.until",
        (session, until, topics),
    )
    await cur.execute(
        f"DELETE FROM {s}.listeners WHERE session = %s AND NOT (topic = ANY(%s::text[]))",
        (session, topics),
    )


async def sweep(cur: Cursor, s: str, now: float) -> None:
    for table, column, horizon in (
        ("topic_dedup", "expires_at", now),
        ("broadcasts", "at", now - 60.0),
        ("listeners", "until", now - 60.0),
    ):
        await cur.execute(
            f"DELETE FROM {s}.{table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {s}.{table} "
            f"WHERE {column} <= %s LIMIT 1000))",
            (horizon,),
        )
