"""The RabbitMQ backend's topics: a topic exchange per topic, a queue per subscription.

The store keeps the topic, its subscriptions and counters. A subscription's queue is bound
to the topic exchange with its routing pattern, so any AMQP client publishing to the
exchange reaches every subscription without a filter. fairq's own ``publish`` decides the
matching subscriptions itself (the same ``SubscriptionIndex`` every backend uses, SNS
filters included) and publishes **one** message to exactly their queues (the default
exchange, the first queue as routing key, the others in the ``BCC`` header: RabbitMQ's
sender-selected distribution), so all copies are routed at once, one confirm covers them,
and a filtered subscription gets only what matches — nothing is filtered after the fact.
A delayed publish sends one copy per matching queue through the delay wheel.

Every broker caches each topic's configuration and subscriptions, and checks one number in
the store before each publish: the version that every change of a topic or subscription
(declare, subscribe, unsubscribe, a deleted queue or topic) raises before it returns. So a
subscription made by any process gets every message published after its ``subscribe``
returned (SPEC §4 rule 2), at the cost of one store read a publish.
"""

from __future__ import annotations

from typing import Any

import orjson

from ...errors import BATCH_LARGER, ConfigConflict, QueueFull, QueueNotFound, TopicNotFound
from ...message import parse_id
from ...model.queues import Envelope, QueueConfig
from ...model.topics import PublishResult, Subscription, SubscriptionIndex, TopicConfig, TopicStats
from ..rules import DedupPlan, plan_dedup, publish_plan, publish_results
from . import topology
from .link import driver_errors
from .queues import AmqpQueues

__all__ = ["AmqpTopics"]

#: the store's counters scope holding the version of every topic's subscriptions
_VERSION_SCOPE = "fairq.topics"


class AmqpTopics(AmqpQueues):
    """Topics over the RabbitMQ queues."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._topics: dict[str, tuple[TopicConfig, dict[str, Subscription], SubscriptionIndex]]
        self._topics = {}
        self._version = -1  # of the cached topics (the store's version when they were read)

    async def _changed(self) -> None:
        """A topic or subscription changed: every broker's cache is stale from now on."""
        await self.store.add_counts(_VERSION_SCOPE, {"version": 1})
        self._topics.clear()

    async def _topic(
        self, topic: str
    ) -> tuple[TopicConfig, dict[str, Subscription], SubscriptionIndex]:
        self._check_open()
        version = (await self.store.read_counts(_VERSION_SCOPE)).get("version", 0)
        if version > self._version:  # only forward: a read that answers late is older
            self._topics.clear()
            self._version = version
        hit = self._topics.get(topic) if version == self._version else None
        if hit is not None:
            return hit
        config = await self.store.topic_config(topic)  # TopicNotFound
        subs = {s.name: s for s in await self.store.subscriptions(topic)}
        index = SubscriptionIndex(subs.values())
        if self._version == version:  # not read before a change another call has seen
            self._topics[topic] = (config, subs, index)
        return config, subs, index

    async def declare_topic(self, name: str, config: TopicConfig) -> None:
        self._check_open()
        admin = await self.link.channel("admin")
        with driver_errors(f"declaring topic {name!r}", self.url.masked):
            await admin.exchange_declare(name, exchange_type="topic", durable=True)
        await self.store.declare_topic(name, config)
        await self._changed()

    async def topic_config(self, name: str) -> TopicConfig:
        return (await self._topic(name))[0]

    async def delete_topic(self, name: str) -> bool:
        self._check_open()
        try:
            subs = await self.store.subscriptions(name)
        except TopicNotFound:
            return False
        for sub in subs:
            await self.delete_queue(sub.queue)
        existed = await self.store.delete_topic(name)
        admin = await self.link.channel("admin")
        with driver_errors(f"deleting topic {name!r}", self.url.masked):
            await admin.exchange_delete(name)
        await self.store.drop_counts(f"topic:{name}")
        await self._changed()
        return existed

    async def delete_queue(self, name: str) -> bool:
        existed = await super().delete_queue(name)
        if existed:  # it may have been a subscription's, which the store dropped with it
            await self._changed()
        return existed

    async def list_topics(self, prefix: str = "") -> list[str]:
        self._check_open()
        return await self.store.list_topics(prefix)

    async def subscribe(self, subscription: Subscription, config: QueueConfig) -> None:
        topic = subscription.topic
        await self._topic(topic)
        old = {s.name: s for s in await self.store.subscriptions(topic)}.get(subscription.name)
        if old is None:
            try:
                await self.store.queue_config(subscription.queue)
            except QueueNotFound:
                pass
            else:
                raise ConfigConflict(
                    f"queue {subscription.queue!r} exists and is not a subscription of {topic!r}"
                )
        await self._prepare_queue(subscription.queue, config)
        admin = await self.link.channel("admin")
        with driver_errors(f"binding subscription {subscription.name!r}", self.url.masked):
            if old is not None and old.filter is None:
                pattern = topology.subscription_pattern(old.routing)
                await admin.queue_unbind(subscription.queue, topic, routing_key=pattern)
            if subscription.filter is None:
                pattern = topology.subscription_pattern(subscription.routing)
                await admin.queue_bind(subscription.queue, topic, routing_key=pattern)
        await self.store.subscribe(subscription, config)
        self._declared(subscription.queue, config)
        await self._changed()

    async def unsubscribe(self, topic: str, name: str) -> bool:
        await self._topic(topic)
        subs = {s.name: s for s in await self.store.subscriptions(topic)}
        sub = subs.get(name)
        if sub is None:
            return False
        await self.store.unsubscribe(topic, name)
        await self._changed()  # before the queue goes: publishers stop naming it
        await self.delete_queue(sub.queue)
        return True

    async def subscriptions(self, topic: str) -> list[Subscription]:
        await self._topic(topic)
        return await self.store.subscriptions(topic)

    async def publish(self, topic: str, envelopes: list[Envelope]) -> list[PublishResult]:
        config, subs, index = await self._topic(topic)
        ids = [self._new_id() for _ in envelopes]
        scope = f"fairq.dedup:topic:{topic}"
        earlier: dict[int, list[str]] = {}
        claimed: list[str] = []
        plan: DedupPlan
        if config.dedup_window > 0 and any(e.dedup_id is not None for e in envelopes):
            first: dict[str, int] = {}
            for env, mid in zip(envelopes, ids, strict=True):
                key = env.dedup_id
                if key is None or key in first or key in claimed:
                    continue
                record = await self.store.claim(scope, key, mid, config.dedup_window, mid)
                if record is None:
                    claimed.append(key)
                else:  # fingerprint: the first publication's id; result: its subscriptions
                    n = parse_id(record.fingerprint or mid)
                    first[key] = n
                    earlier[n] = orjson.loads(record.raw) if record.raw else []
            plan = plan_dedup(envelopes, first.get)
        else:
            plan = plan_dedup(envelopes, lambda _key: None)
        copies = publish_plan(index, subs, plan.fresh)
        position = {id(e): i for i, e in enumerate(envelopes)}
        fresh_ids = [ids[position[id(e)]] for e in plan.fresh]
        try:
            for queue, got in copies.per_queue.items():  # a bounded one it cannot fit: none
                bound = await self._config(queue)
                if bound.max_length is not None and len(got) > bound.max_length:
                    raise QueueFull(queue, bound.max_length, BATCH_LARGER)
            reached, refused = await self._fan_out(
                topic, subs, copies.copies, copies.matched, fresh_ids
            )
            if refused is not None:
                if reached:  # the other subscriptions got their copies: counted
                    await self.store.add_counts(
                        f"topic:{topic}", {"published": len(reached), "copies": sum(reached)}
                    )
                raise refused
        except BaseException:
            for key in claimed:
                await self.store.forget_claim(scope, key)
            raise
        for key in claimed:  # the answer for later duplicates: the subscriptions it reached
            index_of = next(i for i, e in enumerate(plan.fresh) if e.dedup_id == key)
            await self.store.complete_claim(
                scope,
                key,
                fresh_ids[index_of],
                orjson.dumps(copies.matched[index_of]),
                config.dedup_window,
            )
        made = [parse_id(m) for m in fresh_ids]
        published = len(plan.fresh)
        n_copies = sum(len(m) for m in copies.matched)
        unmatched = sum(1 for m in copies.matched if not m)
        await self.store.add_counts(
            f"topic:{topic}",
            {"published": published, "copies": n_copies, "unmatched": unmatched},
        )
        return publish_results(plan, made, copies.matched, earlier)

    async def _fan_out(
        self,
        topic: str,
        subs: dict[str, Subscription],
        copies: list[Envelope],
        matched: list[list[str]],
        ids: list[str],
    ) -> tuple[list[int], QueueFull | None]:
        """Publish the copies. If a bounded subscription refused some, the copies that went
        out of each message that reached a queue, and the ``QueueFull`` to raise."""
        items: list[tuple[str, str, bytes, dict[str, Any], int, str]] = []
        counted: list[list[str]] = []
        owner: list[str] = []  # the message (id) of each item
        for env, names, mid in zip(copies, matched, ids, strict=True):
            queues = [subs[n].queue for n in names]
            if not queues:
                continue
            if env.delay > 0:
                for q in queues:
                    exchange, key = await self._route(q, env.delay)
                    items.append((exchange, key, env.body, dict(env.attributes), 0, mid))
                    counted.append([q])
                    owner.append(mid)
                continue
            headers: dict[str, Any] = dict(env.attributes)
            if len(queues) > 1:
                headers["BCC"] = queues[1:]
            items.append(("", queues[0], env.body, headers, 0, mid))
            counted.append(queues)
            owner.append(mid)
        if not items:
            return [], None
        took = await self._publish(items, f"publishing to topic {topic!r}")
        refused = [qs for qs, ok in zip(counted, took, strict=True) if not ok]
        # a refused publish reached its queues but the full ones (RabbitMQ's nack does not
        # say which): those that may refuse are the bounded reject-publish ones
        full: dict[str, QueueConfig] = {}
        for qs in refused:
            for q in qs:
                config = await self._config(q)
                if config.max_length is not None and config.overflow == "reject":
                    full[q] = config
        reached: dict[str, int] = {}  # copies that went out, by message
        for qs, ok, mid in zip(counted, took, owner, strict=True):
            went = [q for q in qs if ok or q not in full]
            for q in went:
                self._count(q, "sent")
                self.wakeups.notify([q])
            if went:
                reached[mid] = reached.get(mid, 0) + len(went)
        if refused:
            name = next(iter(full), refused[0][0])
            return list(reached.values()), QueueFull(
                name,
                full[name].max_length or 0 if name in full else 0,
                f"RabbitMQ refused {len(refused)} of {len(items)} publishes of topic {topic!r}: "
                f"the bounded subscription queue(s) {', '.join(sorted(full)) or name} may be "
                "full; the other subscriptions got their copies",
                "reject",
            )
        return [], None

    async def topic_stats(self, topic: str) -> TopicStats:
        await self._topic(topic)
        counts = await self.store.read_counts(f"topic:{topic}")
        subs = await self.store.subscriptions(topic)
        return TopicStats(
            published=counts.get("published", 0),
            copies=counts.get("copies", 0),
            unmatched=counts.get("unmatched", 0),
            subscriptions=len(subs),
        )

    def listen_scope(self) -> Any:
        return ("amqp", self.url.host, self.url.port, self.url.vhost)
