"""The Redis backend's topics: subscriptions kept in the topic's family, publishes planned
here with the shared rules (``rules.publish_plan``, ``rules.plan_dedup``) against the
subscriptions of a known version, and stored by one script that refuses a plan made with
an older version (``STALE``: read the subscriptions again and plan again). Filters and
routing are evaluated in Python, once per publish, by the same code as on every backend;
the copies are stored all or none by the script.

``Topic.listen`` across processes: while a process listens to a topic it keeps the key
``t:<topic>:listening`` alive; a publish that sees it returns so, and the publisher then
sends the publications on the channel ``<prefix>listen:<topic>`` (at most once, as
ephemeral listeners are).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from ...errors import ConfigConflict, QueueFull, TopicNotFound
from ...model.queues import Envelope, QueueConfig
from ...model.topics import (
    PublishResult,
    Subscription,
    SubscriptionIndex,
    TopicConfig,
    TopicStats,
)
from ..rules import plan_dedup, publish_plan, publish_results
from .conn import ScriptError
from .core import _config_json
from .queues import RedisQueues, _text

log = logging.getLogger("fairq.redis")

_RETRIES = 50
_LISTEN_TTL_MS = 30_000


@dataclass(slots=True)
class _TopicState:
    version: int
    config: TopicConfig
    subs: dict[str, Subscription]
    index: SubscriptionIndex


def _sub_json(s: Subscription) -> str:
    return orjson.dumps(
        {"queue": s.queue, "filter": s.filter, "routing": s.routing, "push": s.push}
    ).decode()


Deliver = Callable[[list[tuple[Envelope, str]]], None]


class RedisTopics(RedisQueues):
    """Topics on Redis; see the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._topics: dict[str, _TopicState] = {}
        self._origin = secrets.token_hex(8).encode()
        self._sinks: dict[str, Deliver] = {}
        self._keepalive: asyncio.Task[None] | None = None

    async def _topic_call(self, script: str, topic: str, *args: Any) -> Any:
        try:
            return await self.run(script, topic, topic, *args)
        except ScriptError as err:
            if err.code == "NOTOPIC":
                raise TopicNotFound(topic) from None
            self.raise_common(err)

    async def _state(self, topic: str) -> _TopicState:
        have = self._topics.get(topic)
        got = await self._topic_call("topic_read", topic, str(have.version if have else -1))
        if have is not None and len(got) == 1:
            return have
        version, raw, *pairs = got
        subs: dict[str, Subscription] = {}
        for name, sub in zip(pairs[::2], pairs[1::2], strict=True):
            d = orjson.loads(sub)
            n = _text(name)
            subs[n] = Subscription(topic, n, d["queue"], d["filter"], d["routing"], d["push"])
        state = _TopicState(
            int(version), TopicConfig(**orjson.loads(raw)), subs, SubscriptionIndex(subs.values())
        )
        self._topics[topic] = state
        return state

    # -- topics ----------------------------------------------------------------------------
    async def declare_topic(self, name: str, config: TopicConfig) -> None:
        await self.add_families(name)
        data = orjson.dumps({"dedup_window": config.dedup_window}).decode()
        await self.run("declare_topic", name, name, data)

    async def topic_config(self, name: str) -> TopicConfig:
        return (await self._state(name)).config

    async def delete_topic(self, name: str) -> bool:
        self._topics.pop(name, None)
        return bool(await self.run("delete_topic", name, name))

    async def list_topics(self, prefix: str = "") -> list[str]:
        names: list[str] = []
        for fam in await self.families():
            if prefix and not (fam.startswith(prefix) or prefix.startswith(fam)):
                continue
            got = await self.command("HKEYS", f"{self.prefix}{{{fam}}}:topics")
            names.extend(n for n in map(_text, got) if n.startswith(prefix))
        return sorted(names)

    async def subscribe(self, subscription: Subscription, config: QueueConfig) -> None:
        s = subscription
        dlq = config.dead_letter
        await self.add_families(s.queue, *([dlq] if dlq else []))
        new = _config_json(config)
        seen = ""
        while True:
            got = await self._topic_call(
                "subscribe", s.topic, s.name, _sub_json(s), s.queue, new, seen, dlq or ""
            )
            if _text(got[0]) == "ok":
                break
            current = QueueConfig.from_dict(orjson.loads(got[1]))
            current.check_change(s.queue, config)
            seen = _text(got[1])
        if dlq and self.opts.cluster:
            await self.run(
                "declare_queue", dlq, dlq, _config_json(QueueConfig.for_dead_letters()), "x", ""
            )

    def raise_common(self, err: ScriptError) -> None:
        if err.code == "NOTSUB":
            raise ConfigConflict(
                f"queue {err.values[0]!r} already exists and is not the queue of "
                f"subscription {err.values[1]!r}"
            ) from None
        if err.code == "NOTOPIC":
            raise TopicNotFound(err.values[0]) from None
        super().raise_common(err)

    async def unsubscribe(self, topic: str, name: str) -> bool:
        return bool(await self._topic_call("unsubscribe", topic, name))

    async def subscriptions(self, topic: str) -> list[Subscription]:
        subs = (await self._state(topic)).subs
        return [subs[n] for n in sorted(subs)]

    async def publish(self, topic: str, envelopes: list[Envelope]) -> list[PublishResult]:
        for _ in range(_RETRIES):
            state = await self._state(topic)
            earlier: dict[int, list[str]] = {}
            seen: dict[str, int] = {}
            if any(e.dedup_id is not None for e in envelopes):
                wanted = sorted({e.dedup_id for e in envelopes if e.dedup_id is not None})
                key = self.fkey(topic, f"t:{topic}:u")
                got = await self.command("HMGET", key, *wanted)
                now = self.clock.now()
                for d, raw in zip(wanted, got, strict=True):
                    if raw is None:
                        continue
                    mid, exp, names = raw.split(b" ", 2)
                    if float(exp) > now or self.opts.server_clock:
                        seen[d] = int(mid, 16)
                        earlier[int(mid, 16)] = orjson.loads(names)
            plan = plan_dedup(envelopes, seen.get)
            copy_plan = publish_plan(state.index, state.subs, plan.fresh)
            args: list[Any] = [str(state.version), str(len(copy_plan.copies))]
            for c in copy_plan.copies:
                args += (c.body, orjson.dumps(c.attributes) if c.attributes else "", repr(c.delay))
            args.append(str(len(copy_plan.per_queue)))
            for queue, indices in copy_plan.per_queue.items():
                args += (queue, str(len(indices)), *(str(i + 1) for i in indices))
            args.append(str(len(plan.first)))
            for d, i in plan.first.items():
                args += (d, str(i + 1), orjson.dumps(copy_plan.matched[i]))
            args.append(str(len(seen)))
            for d, mid in seen.items():
                args += (d, f"{mid:016x}")
            try:
                got = await self.run("publish", topic, topic, *args)
            except ScriptError as err:
                if err.code == "STALE":
                    self._topics.pop(topic, None)
                    continue
                if err.code == "FULL":
                    name, max_length, overflow, detail = err.values
                    raise QueueFull(name, int(max_length), detail, overflow) from None
                self.raise_common(err)
            made = [int(m, 16) for m in got[1:]]
            await self.drain_outbox(topic)
            results = publish_results(plan, made, copy_plan.matched, earlier)
            if int(got[0]):
                await self._broadcast(topic, envelopes, results)
            return results
        raise ConfigConflict(f"topic {topic!r}: its subscriptions kept changing under this publish")

    async def topic_stats(self, topic: str) -> TopicStats:
        got = await self._topic_call("topic_stats", topic)
        return TopicStats(*(int(x) for x in got))

    # -- ephemeral listeners across processes -----------------------------------------------
    async def _broadcast(
        self, topic: str, envelopes: list[Envelope], results: list[PublishResult]
    ) -> None:
        channel = f"{self.prefix}listen:{topic}"
        for env, r in zip(envelopes, results, strict=True):
            if r.duplicate:
                continue
            head = orjson.dumps([r.message_id, env.routing_key, env.attributes])
            await self.command("PUBLISH", channel, self._origin + b"\n" + head + b"\n" + env.body)

    def _on_listen(self, topic: str, data: bytes) -> None:
        sink = self._sinks.get(topic)
        if sink is None:
            return
        origin, head, body = data.split(b"\n", 2)
        if origin == self._origin:
            return  # this broker's own publish: its listeners got it already
        message_id, routing_key, attrs = orjson.loads(head)
        sink([(Envelope(body, attrs, routing_key=routing_key), message_id)])

    def attach_listeners(self, topic: str, deliver: Deliver | None) -> None:
        if deliver is None:
            self._sinks.pop(topic, None)
        else:
            self._sinks[topic] = deliver
        if self._subscriber is None:
            return
        sub = self._subscriber
        if deliver is None:
            asyncio.get_running_loop().create_task(sub.unlisten(topic))
        else:
            asyncio.get_running_loop().create_task(sub.listen(topic))
            if self._keepalive is None or self._keepalive.done():
                self._keepalive = asyncio.get_running_loop().create_task(self._keep_listening())

    async def _keep_listening(self) -> None:
        """While this broker has listeners: keep each topic's ``listening`` key alive."""
        while self._sinks and not self._closed:
            for topic in list(self._sinks):
                with contextlib.suppress(Exception):
                    await self.command(
                        "SET", self.fkey(topic, f"t:{topic}:listening"), "1", "PX", _LISTEN_TTL_MS
                    )
            await asyncio.sleep(_LISTEN_TTL_MS / 3000)

    async def close(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
        await super().close()
