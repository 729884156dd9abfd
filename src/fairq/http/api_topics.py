"""Topics under ``/v1`` (SPEC §4): declare, subscribe, publish and the live stream; the rows
of the route table are in :data:`fairq.http.api.ROUTES`."""

from __future__ import annotations

import orjson
from starlette.responses import Response

from ..broker import Broker
from ..message import check_name
from ..pubsub import Topic
from . import models as m
from .calls import Call, check_batch, check_wait, infos
from .errors import ApiError
from .nesting import MAX_DEPTH, too_deep


async def topic_info(broker: Broker, name: str) -> m.TopicInfo:
    t = broker.topic(name)
    config = await t.config()
    subs = await t.subscriptions()
    return m.TopicInfo(
        name=name,
        dedup_window=config.dedup_window,
        stats=await t.stats(),
        subscriptions=[m.subscription(s) for s in subs],
    )


async def list_topics(c: Call) -> m.TopicList:
    q: m.PrefixQuery = c.query
    names = await c.broker.list_topics(q.prefix)
    return m.TopicList(await infos(c.broker, names, topic_info))


async def declare_topic(c: Call) -> m.TopicInfo:
    body: m.TopicOptions = c.body
    await c.broker.declare_topic(c.path["topic"], dedup_window=body.dedup_window)
    return await topic_info(c.broker, c.path["topic"])


async def get_topic(c: Call) -> m.TopicInfo:
    return await topic_info(c.broker, check_name(c.path["topic"], "topic"))


async def delete_topic(c: Call) -> None:
    name = c.path["topic"]
    if not await c.broker.delete_topic(name):
        from ..errors import TopicNotFound

        raise TopicNotFound(name)


async def _topic(c: Call) -> Topic:
    t = c.broker.topic(c.path["topic"])
    await t.config()  # TopicNotFound before anything else
    return t


async def subscribe(c: Call) -> m.SubscriptionInfo:
    body: m.SubscribeRequest = c.body
    t = await _topic(c)
    name = c.path["subscription"]
    options = body.queue_options.to_options() if body.queue_options else {}
    await t.subscribe(name, filter=body.filter, routing=body.routing, push=body.push, **options)
    for s in await t.subscriptions():
        if s.name == name:
            return m.subscription(s)
    raise ApiError(409, "not_found", f"subscription {name!r} was removed meanwhile")


async def list_subscriptions(c: Call) -> m.SubscriptionList:
    t = await _topic(c)
    return m.SubscriptionList([m.subscription(s) for s in await t.subscriptions()])


async def unsubscribe(c: Call) -> None:
    t = await _topic(c)
    name = c.path["subscription"]
    if not await t.unsubscribe(name):
        raise ApiError(404, "not_found", f"topic {t.name!r} has no subscription {name!r}")


async def publish(c: Call) -> m.Published:
    body: m.PublishRequest = c.body
    check_batch(c, len(body.messages))
    check_wait(c, body.timeout)
    t = await _topic(c)
    results = await t.publish_batch([o.to_outgoing() for o in body.messages], body.timeout)
    return m.Published(results)


async def stream(c: Call) -> Response:
    from .stream import topic_stream

    q: m.StreamQuery = c.query
    t = await _topic(c)
    policy = None
    if q.filter is not None:
        if too_deep(q.filter):
            raise ApiError(400, "bad_request", f"filter nests more than {MAX_DEPTH} levels deep")
        try:
            policy = orjson.loads(q.filter)
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, "bad_request", f"filter is not JSON: {exc}") from exc
    listener = t.listen(routing=q.routing, filter=policy, buffer=q.buffer)
    return topic_stream(listener)
