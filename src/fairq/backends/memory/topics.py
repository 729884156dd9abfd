"""The memory backend's topics: subscriptions and atomic publishes over its queues."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...clock import Clock
from ...errors import ConfigConflict, TopicNotFound
from ...model.queues import Envelope, QueueConfig
from ...model.topics import PublishResult, Subscription, SubscriptionIndex, TopicConfig, TopicStats
from ..rules import plan_dedup, publish_plan, publish_results
from .queues import MemoryQueues


@dataclass(slots=True, eq=False)
class _Topic:
    name: str
    config: TopicConfig
    subs: dict[str, Subscription] = field(default_factory=dict)
    dedup: dict[str, tuple[int, list[str], float]] = field(default_factory=dict)
    published: int = 0
    copies: int = 0
    unmatched: int = 0
    _index: SubscriptionIndex | None = None

    def index(self) -> SubscriptionIndex:
        if self._index is None:
            self._index = SubscriptionIndex(self.subs.values())
        return self._index


class MemoryTopics(MemoryQueues):
    """Topics on top of the memory queues."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self._topics: dict[str, _Topic] = {}

    def _queue_deleted(self, name: str) -> None:
        super()._queue_deleted(name)
        for t in self._topics.values():
            for sub_name in [n for n, s in t.subs.items() if s.queue == name]:
                del t.subs[sub_name]
                t._index = None

    # -- topics ----------------------------------------------------------------------------
    def _topic(self, name: str) -> _Topic:
        self._open()
        t = self._topics.get(name)
        if t is None:
            raise TopicNotFound(name)
        return t

    async def declare_topic(self, name: str, config: TopicConfig) -> None:
        self._open()
        t = self._topics.get(name)
        if t is None:
            self._topics[name] = _Topic(name, config)
        else:
            t.config = config

    async def topic_config(self, name: str) -> TopicConfig:
        return self._topic(name).config

    async def delete_topic(self, name: str) -> bool:
        self._open()
        t = self._topics.pop(name, None)
        if t is None:
            return False
        for s in t.subs.values():
            await self.delete_queue(s.queue)
        return True

    async def list_topics(self, prefix: str = "") -> list[str]:
        self._open()
        return sorted(n for n in self._topics if n.startswith(prefix))

    async def subscribe(self, subscription: Subscription, config: QueueConfig) -> None:
        t = self._topic(subscription.topic)
        existing = self._queues.get(subscription.queue)
        if existing is not None and subscription.name not in t.subs:
            raise ConfigConflict(
                f"queue {subscription.queue!r} already exists and is not the queue of "
                f"subscription {subscription.name!r}"
            )
        if existing is not None:
            existing.config.check_change(subscription.queue, config)
        await self.declare_queue(subscription.queue, config)
        t.subs[subscription.name] = subscription
        t._index = None

    async def unsubscribe(self, topic: str, name: str) -> bool:
        t = self._topic(topic)
        s = t.subs.get(name)
        if s is None:
            return False
        await self.delete_queue(s.queue)
        return True

    async def subscriptions(self, topic: str) -> list[Subscription]:
        t = self._topic(topic)
        return [t.subs[n] for n in sorted(t.subs)]

    async def publish(self, topic: str, envelopes: list[Envelope]) -> list[PublishResult]:
        now = self.clock.now()
        self._sweep(now)
        t = self._topic(topic)
        earlier: dict[int, list[str]] = {}

        def sent_before(dedup_id: str) -> int | None:
            hit = t.dedup.get(dedup_id)
            if hit is None or hit[2] <= now:
                return None
            earlier[hit[0]] = hit[1]
            return hit[0]

        plan = plan_dedup(envelopes, sent_before)
        copy_plan = publish_plan(t.index(), t.subs, plan.fresh)
        matched = copy_plan.matched
        # check every subscription queue before changing any: all copies or none
        sends = [
            (q, *self._plan_send(q, [copy_plan.copies[i] for i in indices], now))
            for q, indices in ((self._q(n), ix) for n, ix in copy_plan.per_queue.items())
        ]
        for q, send_plan, victims in sends:
            self._apply_send(q, send_plan, victims, now)
        made = [self._new_id(now) for _ in plan.fresh]
        if plan.first and t.config.dedup_window > 0:
            expires = now + t.config.dedup_window
            for dedup_id, i in plan.first.items():
                t.dedup[dedup_id] = (made[i], matched[i], expires)
            if len(t.dedup) > 4096:
                t.dedup = {k: v for k, v in t.dedup.items() if v[2] > now}
        t.published += len(plan.fresh)
        t.copies += sum(len(names) for names in matched)
        t.unmatched += sum(1 for names in matched if not names)
        return publish_results(plan, made, matched, earlier)

    async def topic_stats(self, topic: str) -> TopicStats:
        t = self._topic(topic)
        return TopicStats(t.published, t.copies, t.unmatched, len(t.subs))
