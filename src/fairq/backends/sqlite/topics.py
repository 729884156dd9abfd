"""The SQLite backend's publish/subscribe operations, each inside one transaction.

A subscription is a row in ``fairq_subscriptions`` pointing at its queue; publishing
matches each message against the topic's cached :class:`SubscriptionIndex` and stores
the copies with the queue operations' own ``send`` — in the same transaction, so a full
subscription queue rolls the whole publish back.
"""

from __future__ import annotations

import orjson

from ...errors import ConfigConflict
from ...model.queues import Envelope, QueueConfig
from ...model.topics import PublishResult, Subscription, TopicConfig, TopicStats
from ..rules import plan_dedup, publish_plan, publish_results
from . import messages, queues
from .txn import Txn


def declare_topic(t: Txn, name: str, config: TopicConfig) -> None:
    data = orjson.dumps({"dedup_window": config.dedup_window}).decode()
    topic = t.find_topic(name)
    if topic is None:
        t.conn.execute(
            "INSERT INTO fairq_topics (name, config, created_at) VALUES (?, ?, ?)",
            (name, data, t.now),
        )
    elif topic.config != config:
        t.conn.execute("UPDATE fairq_topics SET config = ? WHERE id = ?", (data, topic.id))
    else:
        return
    t.configs_changed()


def topic_config(t: Txn, name: str) -> TopicConfig:
    return t.topic(name).config


def delete_topic(t: Txn, name: str) -> bool:
    topic = t.find_topic(name)
    if topic is None:
        return False
    for s in topic.subs.values():
        queues.delete_queue(t, s.queue)
    t.conn.execute("DELETE FROM fairq_topic_dedup WHERE topic_id = ?", (topic.id,))
    t.conn.execute("DELETE FROM fairq_topics WHERE id = ?", (topic.id,))
    t.configs_changed()
    return True


def subscribe(t: Txn, sub: Subscription, config: QueueConfig) -> None:
    topic = t.topic(sub.topic)
    if sub.name not in topic.subs and t.find(sub.queue) is not None:
        raise ConfigConflict(
            f"queue {sub.queue!r} already exists and is not the queue of subscription {sub.name!r}"
        )
    queues.declare_queue(t, sub.queue, config)
    q = t.queue(sub.queue)
    t.conn.execute(
        "INSERT INTO fairq_subscriptions (topic_id, name, queue_id, filter, routing, push, "
        "created_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (topic_id, name) DO UPDATE SET "
        "queue_id = excluded.queue_id, filter = excluded.filter, routing = excluded.routing, "
        "push = excluded.push",
        (
            topic.id,
            sub.name,
            q.id,
            None if sub.filter is None else orjson.dumps(sub.filter).decode(),
            sub.routing,
            sub.push,
            t.now,
        ),
    )
    t.configs_changed()
    # keep the loaded topic (it may hold thousands of subscriptions): change it in place
    topic.subs[sub.name] = sub
    topic._index = None
    t.store.topics[topic.name] = topic


def unsubscribe(t: Txn, topic_name: str, name: str) -> bool:
    s = t.topic(topic_name).subs.get(name)
    if s is None:
        return False
    queues.delete_queue(t, s.queue)  # also removes the subscription row
    return True


def subscriptions(t: Txn, topic_name: str) -> list[Subscription]:
    subs = t.topic(topic_name).subs
    return [subs[n] for n in sorted(subs)]


def publish(t: Txn, topic_name: str, envs: list[Envelope]) -> list[PublishResult]:
    topic = t.topic(topic_name)
    conn = t.conn
    now = t.now
    earlier: dict[int, list[str]] = {}

    def sent_before(dedup_id: str) -> int | None:
        hit = conn.execute(
            "SELECT msg_id, subscriptions FROM fairq_topic_dedup "
            "WHERE topic_id = ? AND dedup_id = ? AND expires_at > ?",
            (topic.id, dedup_id, now),
        ).fetchone()
        if hit is None:
            return None
        earlier[hit[0]] = orjson.loads(hit[1])
        return int(hit[0])

    plan = plan_dedup(envs, sent_before)
    copy_plan = publish_plan(topic.index(), topic.subs, plan.fresh)
    matched = copy_plan.matched
    messages.store_copies(t, copy_plan)  # QueueFull here rolls the whole publish back
    made = list(t.allocate(len(plan.fresh))) if plan.fresh else []
    if plan.first and topic.config.dedup_window > 0:
        expires = now + topic.config.dedup_window
        conn.executemany(
            "INSERT OR REPLACE INTO fairq_topic_dedup (topic_id, dedup_id, msg_id, "
            "subscriptions, expires_at) VALUES (?, ?, ?, ?, ?)",
            [
                (topic.id, d, made[i], orjson.dumps(matched[i]).decode(), expires)
                for d, i in plan.first.items()
            ],
        )
    copies = sum(len(names) for names in matched)
    unmatched = sum(1 for names in matched if not names)
    conn.execute(
        "UPDATE fairq_topics SET published = published + ?, copies = copies + ?, "
        "unmatched = unmatched + ? WHERE id = ?",
        (len(plan.fresh), copies, unmatched, topic.id),
    )
    return publish_results(plan, made, matched, earlier)


def topic_stats(t: Txn, topic_name: str) -> TopicStats:
    topic = t.topic(topic_name)
    row = t.conn.execute(
        "SELECT published, copies, unmatched FROM fairq_topics WHERE id = ?", (topic.id,)
    ).fetchone()
    return TopicStats(row[0], row[1], row[2], len(topic.subs))
