"""The REST API ``/v1``: one table of routes, each with its handler and its types.

:data:`ROUTES` is the single source of the API: :func:`fairq.http.app.create_app` mounts
it, :mod:`fairq.http.openapi` turns it into ``/openapi.json`` and ``docs/http-api.md``.
A :class:`Route` names its method, path, required scope, request body, query and
response models (:mod:`fairq.http.models`); its handler gets a :class:`Call` with the
decoded, checked values and returns a response model (or None for ``204``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import msgspec
import orjson
from starlette.requests import Request
from starlette.responses import Response

from ..attention import KeyStats
from ..broker import Broker
from ..errors import InvalidOption, QueueNotFound
from ..message import check_key, check_name
from ..pubsub import Topic
from ..waitingroom import RoomStats, Status, Ticket
from . import api_idempotency as idem
from . import api_rooms as rooms
from . import models as m
from .auth import Principal, Scope
from .errors import ApiError
from .nesting import MAX_DEPTH, too_deep

InfoT = TypeVar("InfoT")

if TYPE_CHECKING:
    from .metrics import Metrics
    from .sampler import Sampler

__all__ = ["ROUTES", "Call", "Limits", "Route", "ServerState"]


@dataclass(frozen=True, slots=True)
class Limits:
    """What one request may ask for. ``max_body`` None: ``max_message_bytes × max_batch``."""

    max_batch: int = 100
    max_wait: float = 20.0
    max_receipts: int = 1000
    max_body: int | None = None

    def body_limit(self, max_message_bytes: int) -> int:
        return self.max_body if self.max_body is not None else max_message_bytes * self.max_batch

    def value(self, name: str) -> float:
        return float(getattr(self, name))


@dataclass(slots=True)
class ServerState:
    """What handlers share: the broker, the limits, the stats sampler and the metrics."""

    broker: Broker
    limits: Limits
    sampler: Sampler
    metrics: Metrics
    auth: bool = False
    #: room name (or "*") -> the secret= a room was made with (``FAIRQ_ROOM_SECRETS``)
    room_secrets: Mapping[str, bytes] = field(default_factory=dict)


@dataclass(slots=True)
class Call:
    """One request, decoded: path parameters, body and query models."""

    request: Request
    state: ServerState
    path: dict[str, str]
    body: Any = None
    query: Any = None
    #: who made the request; None on a public route called without a valid key
    principal: Principal | None = None

    @property
    def broker(self) -> Broker:
        return self.state.broker


Handler = Callable[[Call], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Route:
    """One operation of the API (see the module docstring)."""

    method: str
    path: str
    op: str
    tag: str
    scope: Scope
    summary: str
    handler: Handler
    body: type | None = None
    query: type | None = None
    response: type | None = None
    status: int = 200
    errors: tuple[int, ...] = ()
    stream: bool = False  # text/event-stream
    idempotent: bool = False  # honours Idempotency-Key (api_idempotency.IdempotentCall)
    description: str = ""

    @property
    def path_params(self) -> list[str]:
        return re.findall(r"\{(\w+)\}", self.path)


#: path parameters: name → (what it is, JSON schema pattern)
PATH_PARAMS: dict[str, tuple[str, str]] = {
    "queue": ("queue name", m.NAME_PATTERN),
    "topic": ("topic name", m.NAME_PATTERN),
    "subscription": ("subscription name", m.NAME_PATTERN),
    "domain": ("attention domain name", m.NAME_PATTERN),
    "key": ("attention key, or idempotency key", m.KEY_PATTERN),
    "room": ("waiting room name", m.NAME_PATTERN),
    "namespace": ("idempotency or version namespace", m.NAME_PATTERN),
    "entity": ("entity id", m.KEY_PATTERN),
}


def _check_batch(c: Call, n: int, what: str = "max_batch") -> None:
    most = getattr(c.state.limits, what)
    if n > most:
        raise ApiError(422, "validation_error", f"at most {most} items per request, got {n}")


def _check_wait(c: Call, seconds: float) -> None:
    if seconds > c.state.limits.max_wait:
        raise ApiError(
            422, "validation_error", f"wait at most {c.state.limits.max_wait:g} s, got {seconds:g}"
        )


# -- queues --------------------------------------------------------------------------------
async def queue_info(broker: Broker, name: str) -> m.QueueInfo:
    q = broker.queue(name)
    return m.QueueInfo(name=name, config=await q.config(), stats=await q.stats())


async def list_queues(c: Call) -> m.QueueList:
    q: m.QueueListQuery = c.query
    # names are cheap; each queue's options and stats are not: only a page of them is read
    names = sorted(await c.broker.list_queues(q.prefix))
    if q.cursor is not None:
        names = [n for n in names if n > q.cursor]
    page = names[: q.limit]
    infos = []
    for name in page:
        try:
            infos.append(await queue_info(c.broker, name))
        except QueueNotFound:  # deleted meanwhile
            continue
    return m.QueueList(infos, page[-1] if len(names) > q.limit else None)


async def declare_queue(c: Call) -> m.QueueInfo:
    name = c.path["queue"]
    options: m.QueueOptions = c.body
    await c.broker.declare_queue(name, **options.to_options())
    c.state.sampler.forget_config(name)
    return await queue_info(c.broker, name)


async def get_queue(c: Call) -> m.QueueInfo:
    return await queue_info(c.broker, check_name(c.path["queue"]))


async def delete_queue(c: Call) -> None:
    name = c.path["queue"]
    if not await c.broker.delete_queue(name):
        raise QueueNotFound(name)


async def send(c: Call) -> m.Ids:
    body: m.SendRequest = c.body
    _check_batch(c, len(body.messages))
    _check_wait(c, body.timeout)
    q = c.broker.queue(c.path["queue"])
    return m.Ids(await q.send_batch([o.to_outgoing() for o in body.messages], body.timeout))


async def receive(c: Call) -> m.Messages:
    body: m.ReceiveRequest = c.body
    _check_batch(c, body.max_messages)
    _check_wait(c, body.wait)
    q = c.broker.queue(c.path["queue"])
    got = await q.receive(body.max_messages, body.visibility_timeout, body.wait)
    return m.Messages([m.message(x) for x in got])


async def peek(c: Call) -> m.Messages:
    query: m.PeekQuery = c.query
    got = await c.broker.queue(c.path["queue"]).peek(query.limit)
    return m.Messages([m.message(x) for x in got])


async def ack(c: Call) -> m.AckResult:
    body: m.AckRequest = c.body
    _check_batch(c, len(body.receipts), "max_receipts")
    backend = c.broker.backend
    name = check_name(c.path["queue"])
    lost = await backend.ack(name, body.receipts)
    return m.AckResult(len(body.receipts) - len(lost), lost)


async def nack(c: Call) -> None:
    body: m.NackRequest = c.body
    await c.broker.queue(c.path["queue"])._nack(body.receipt, body.delay)


async def extend(c: Call) -> m.ExtendResult:
    body: m.ExtendRequest = c.body
    _check_batch(c, len(body.receipts), "max_receipts")
    lost = await c.broker.queue(c.path["queue"]).extend_batch(body.receipts, body.seconds)
    return m.ExtendResult(lost)


async def dead_letter(c: Call) -> None:
    body: m.DeadLetterRequest = c.body
    await c.broker.queue(c.path["queue"])._dead_letter(body.receipt, body.reason)


async def purge(c: Call) -> m.Purged:
    return m.Purged(await c.broker.queue(c.path["queue"]).purge())


async def redrive(c: Call) -> m.Redriven:
    body: m.RedriveRequest = c.body
    name = check_name(c.path["queue"])
    await c.broker.queue(name).stats()  # 404 for a queue that is not there
    return m.Redriven(await c.broker.redrive(name, body.to, body.limit))


async def history(c: Call) -> m.History:
    name = check_name(c.path["queue"])
    await c.broker.queue(name).stats()
    return c.state.sampler.history(name)


# -- topics --------------------------------------------------------------------------------
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


async def _infos(
    broker: Broker, names: list[str], info: Callable[[Broker, str], Awaitable[InfoT]]
) -> list[InfoT]:
    """``info`` of each name, leaving out the ones deleted meanwhile."""
    infos = []
    for name in names:
        try:
            infos.append(await info(broker, name))
        except LookupError:
            continue
    return infos


async def list_topics(c: Call) -> m.TopicList:
    q: m.PrefixQuery = c.query
    names = await c.broker.list_topics(q.prefix)
    return m.TopicList(await _infos(c.broker, names, topic_info))


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
    _check_batch(c, len(body.messages))
    _check_wait(c, body.timeout)
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


# -- attention -----------------------------------------------------------------------------
async def attention_info(broker: Broker, name: str) -> m.AttentionInfo:
    a = broker.attention(name)
    config = await a.config()
    return m.AttentionInfo(
        name=name,
        queue=a.queue_name,
        config=m.attention_config(config),
        stats=await a.stats(),
    )


async def list_attention(c: Call) -> m.AttentionList:
    q: m.PrefixQuery = c.query
    names = await c.broker.list_attention(q.prefix)
    return m.AttentionList(await _infos(c.broker, names, attention_info))


async def declare_attention(c: Call) -> m.AttentionInfo:
    from ..attention import Plan

    body: m.AttentionOptions = c.body
    plans = None
    if body.plans is not None:
        plans = {
            n: Plan(p.max_concurrency, p.max_messages, p.max_time, p.rate, p.burst, p.weight)
            for n, p in body.plans.items()
        }
    domain = c.path["domain"]
    await c.broker.declare_attention(
        domain,
        plans=plans,
        default_plan=body.default_plan,
        work_queue=body.work_queue,
        queue_options=body.queue_options.to_options() if body.queue_options else None,
        slice_lease=body.slice_lease,
        charge=body.charge,
        shards=body.shards,
    )
    return await attention_info(c.broker, domain)


async def get_attention(c: Call) -> m.AttentionInfo:
    return await attention_info(c.broker, check_name(c.path["domain"], "attention domain"))


async def delete_attention(c: Call) -> None:
    name = c.path["domain"]
    if not await c.broker.delete_attention(name):
        from ..errors import AttentionNotFound

        raise AttentionNotFound(name)


async def attention_publish(c: Call) -> m.Ids:
    body: m.SendRequest = c.body
    _check_batch(c, len(body.messages))
    _check_wait(c, body.timeout)
    a = c.broker.attention(c.path["domain"])
    key = check_key(c.path["key"])
    await a.config()
    return m.Ids(await a.publish_batch(key, [o.to_outgoing() for o in body.messages], body.timeout))


async def set_resource(c: Call) -> KeyStats:
    body: m.ResourceRequest = c.body
    a = c.broker.attention(c.path["domain"])
    key = check_key(c.path["key"])
    config = await a.config()
    if body.plan is not None and body.plan not in config.plans:
        raise InvalidOption(
            f"plan {body.plan!r} is not one of the domain's plans: {', '.join(config.plans)}"
        )
    await a.set_resource(key, plan=body.plan, state=body.state, tenant=body.tenant)
    return await _key_stats(c, key)


async def _key_stats(c: Call, key: str) -> KeyStats:
    a = c.broker.attention(c.path["domain"])
    for k in await a.key_stats(top=1_000_000):
        if k.key == key:
            return k
    raise ApiError(404, "not_found", f"attention domain {a.name!r} has no key {key!r}")


async def get_key(c: Call) -> KeyStats:
    key = check_key(c.path["key"])
    await c.broker.attention(c.path["domain"]).config()
    return await _key_stats(c, key)


async def remove_key(c: Call) -> None:
    q: m.RemoveQuery = c.query
    a = c.broker.attention(c.path["domain"])
    key = check_key(c.path["key"])
    await a.config()
    await a.remove(key, purge=q.purge)


async def key_stats(c: Call) -> m.KeyList:
    q: m.KeysQuery = c.query
    a = c.broker.attention(c.path["domain"])
    return m.KeyList(await a.key_stats(top=q.top))


async def tenant_stats(c: Call) -> m.TenantList:
    q: m.KeysQuery = c.query
    a = c.broker.attention(c.path["domain"])
    return m.TenantList(await a.tenant_stats(top=q.top))


# -- the dashboard's view and the server ---------------------------------------------------
async def overview(c: Call) -> m.Overview:
    view = await c.state.sampler.overview()
    return msgspec.structs.replace(view, auth=c.state.auth) if c.state.auth else view


async def healthz(c: Call) -> m.Health:
    await c.broker.list_queues("")  # the backend answers
    # the URL names hosts, users, paths: only for callers who may read the server anyway
    url = c.broker.url
    return m.Health("ok", url if c.principal is not None else urlsplit(url).scheme)


async def metrics(c: Call) -> Response:
    from .metrics import CONTENT_TYPE

    snapshot = await c.state.sampler.fresh()
    readings = await c.state.metrics.read(c.broker, snapshot.stats)
    return Response(c.state.metrics.render(readings), media_type=CONTENT_TYPE)


Q, T, A, D = "queues", "topics", "attention", "dashboard"
R, ID = "rooms", "idempotency"
E_Q = (400, 404, 422)
ROOM = "/v1/rooms/{room}"
IKEY = "/v1/idempotency/{namespace}/keys/{key}"
ROUTES: tuple[Route, ...] = (
    # queues
    Route("GET", "/v1/queues", "listQueues", Q, "read", "List queues with their options and stats",
          list_queues, query=m.QueueListQuery, response=m.QueueList,
          description="A page of at most `limit` queues by name; pass `next_cursor` as "
          "`cursor` for the next page (null: the last)."),
    Route("PUT", "/v1/queues/{queue}", "declareQueue", Q, "admin",
          "Declare a queue (create, or update its options)", declare_queue,
          body=m.QueueOptions, response=m.QueueInfo, errors=(400, 409, 422),
          description="Idempotent. `fifo` and `max_priority` cannot change (409)."),
    Route("GET", "/v1/queues/{queue}", "getQueue", Q, "read", "A queue's options and stats",
          get_queue, response=m.QueueInfo, errors=(400, 404)),
    Route("DELETE", "/v1/queues/{queue}", "deleteQueue", Q, "admin",
          "Delete a queue and its messages", delete_queue, status=204, errors=(400, 404)),
    Route("POST", "/v1/queues/{queue}/messages", "sendMessages", Q, "send",
          "Send a batch of messages (all or none)", send, body=m.SendRequest, response=m.Ids,
          errors=(400, 404, 409, 413, 422, 429), idempotent=True,
          description="Answers the ids in order (a deduplicated message: the first id). "
          "429 when a bounded queue is full."),
    Route("GET", "/v1/queues/{queue}/messages", "peekMessages", Q, "receive",
          "Peek at messages in delivery order without leasing them", peek,
          query=m.PeekQuery, response=m.Messages, errors=E_Q),
    Route("POST", "/v1/queues/{queue}/receive", "receiveMessages", Q, "receive",
          "Receive (lease) messages, with an optional long poll", receive,
          body=m.ReceiveRequest, response=m.Messages, errors=E_Q,
          description="Answers as soon as a message is there, or with an empty list "
          "after `wait` seconds."),
    Route("POST", "/v1/queues/{queue}/ack", "ackMessages", Q, "receive",
          "Ack deliveries by receipt", ack, body=m.AckRequest, response=m.AckResult,
          errors=E_Q, description="Receipts whose lease is gone are listed in `lost`; "
          "the others are acked."),
    Route("POST", "/v1/queues/{queue}/nack", "nackMessage", Q, "receive",
          "Give a delivery back (visible again after `delay`)", nack, body=m.NackRequest,
          status=204, errors=(400, 404, 409, 422)),
    Route("POST", "/v1/queues/{queue}/extend", "extendLeases", Q, "receive",
          "Extend leases by receipt", extend, body=m.ExtendRequest, response=m.ExtendResult,
          errors=E_Q),
    Route("POST", "/v1/queues/{queue}/dead-letter", "deadLetterMessage", Q, "receive",
          "Move a delivery to the dead-letter queue at once", dead_letter,
          body=m.DeadLetterRequest, status=204, errors=(400, 404, 409, 422)),
    Route("POST", "/v1/queues/{queue}/purge", "purgeQueue", Q, "admin",
          "Delete every message of a queue", purge, response=m.Purged, errors=(400, 404)),
    Route("POST", "/v1/queues/{queue}/redrive", "redriveQueue", Q, "admin",
          "Move dead letters back to their source queue (or `to`)", redrive,
          body=m.RedriveRequest, response=m.Redriven, errors=E_Q),
    Route("GET", "/v1/queues/{queue}/history", "queueHistory", D, "read",
          "A queue's sampled depth and rates over the last minutes", history,
          response=m.History, errors=(400, 404)),
    # topics
    Route("GET", "/v1/topics", "listTopics", T, "read",
          "List topics with their stats and subscriptions", list_topics,
          query=m.PrefixQuery, response=m.TopicList),
    Route("PUT", "/v1/topics/{topic}", "declareTopic", T, "admin",
          "Declare a topic (create, or update its options)", declare_topic,
          body=m.TopicOptions, response=m.TopicInfo, errors=(400, 422)),
    Route("GET", "/v1/topics/{topic}", "getTopic", T, "read",
          "A topic's options, stats and subscriptions", get_topic, response=m.TopicInfo,
          errors=(400, 404)),
    Route("DELETE", "/v1/topics/{topic}", "deleteTopic", T, "admin",
          "Delete a topic, its subscriptions and their queues", delete_topic, status=204,
          errors=(400, 404)),
    Route("GET", "/v1/topics/{topic}/subscriptions", "listSubscriptions", T, "read",
          "A topic's subscriptions", list_subscriptions, response=m.SubscriptionList,
          errors=(400, 404)),
    Route("PUT", "/v1/topics/{topic}/subscriptions/{subscription}", "subscribe", T, "admin",
          "Create or update a subscription (its queue is `<topic>.<subscription>`)",
          subscribe, body=m.SubscribeRequest, response=m.SubscriptionInfo,
          errors=(400, 404, 409, 422)),
    Route("DELETE", "/v1/topics/{topic}/subscriptions/{subscription}", "unsubscribe", T,
          "admin", "Remove a subscription and delete its queue", unsubscribe, status=204,
          errors=(400, 404)),
    Route("POST", "/v1/topics/{topic}/messages", "publishMessages", T, "send",
          "Publish a batch of messages to every matching subscription (all or none)",
          publish, body=m.PublishRequest, response=m.Published,
          errors=(400, 404, 409, 413, 422, 429), idempotent=True),
    Route("GET", "/v1/topics/{topic}/stream", "streamTopic", T, "receive",
          "Listen live (Server-Sent Events): what is published from now on, at most once",
          stream, query=m.StreamQuery, stream=True, errors=E_Q,
          description="Each message is an event `message` whose data is a Message (JSON) "
          "and whose id is the message id; a listener more than `buffer` messages behind "
          "loses the oldest, announced by an event `dropped` with the count so far. A "
          "comment line every 15 s keeps the connection alive. Sees what is published "
          "through this server process."),
    # attention
    Route("GET", "/v1/attention", "listAttention", A, "read",
          "List attention domains with their options and counters", list_attention,
          query=m.PrefixQuery, response=m.AttentionList),
    Route("PUT", "/v1/attention/{domain}", "declareAttention", A, "admin",
          "Declare an attention domain (create, or update its options)", declare_attention,
          body=m.AttentionOptions, response=m.AttentionInfo, errors=(400, 409, 422)),
    Route("GET", "/v1/attention/{domain}", "getAttention", A, "read",
          "An attention domain's options and counters", get_attention,
          response=m.AttentionInfo, errors=(400, 404)),
    Route("DELETE", "/v1/attention/{domain}", "deleteAttention", A, "admin",
          "Delete an attention domain's keys and signals (its work queues stay)",
          delete_attention, status=204, errors=(400, 404)),
    Route("GET", "/v1/attention/{domain}/keys", "attentionKeys", A, "read",
          "The busiest keys (by backlog, then in flight)", key_stats, query=m.KeysQuery,
          response=m.KeyList, errors=E_Q),
    Route("GET", "/v1/attention/{domain}/tenants", "attentionTenants", A, "read",
          "The busiest tenants over the last minute: worker-time share, slices, messages, "
          "backlog, at cap", tenant_stats, query=m.KeysQuery, response=m.TenantList,
          errors=E_Q),
    Route("GET", "/v1/attention/{domain}/keys/{key}", "getAttentionKey", A, "read",
          "One key's backlog, slices, plan, state and tenant", get_key,
          response=KeyStats, errors=(400, 404)),
    Route("PATCH", "/v1/attention/{domain}/keys/{key}", "setResource", A, "admin",
          "Set a key's plan, state and/or tenant", set_resource, body=m.ResourceRequest,
          response=KeyStats, errors=E_Q),
    Route("DELETE", "/v1/attention/{domain}/keys/{key}", "removeKey", A, "admin",
          "Mark a key removed (its signals are dropped); `purge` also empties its queue",
          remove_key, query=m.RemoveQuery, status=204, errors=E_Q),
    Route("POST", "/v1/attention/{domain}/keys/{key}/messages", "publishToKey", A, "send",
          "Publish work for a key (work messages and the key's signal, atomically)",
          attention_publish, body=m.SendRequest, response=m.Ids,
          errors=(400, 404, 409, 413, 422, 429)),
    # waiting rooms
    Route("GET", "/v1/rooms", "listRooms", R, "read", "List waiting rooms with their stats",
          rooms.list_rooms, query=m.PrefixQuery, response=rooms.RoomList),
    Route("PUT", ROOM, "declareRoom", R, "admin",
          "Create a waiting room, or update the options given", rooms.declare_room,
          body=rooms.RoomOptions, response=RoomStats, errors=(400, 409, 422),
          description="Idempotent. A new room signs with a key generated once and kept in "
          "the backend; a room your app made with its own `secret=` cannot be updated here "
          "(422)."),
    Route("GET", ROOM, "getRoom", R, "read", "A waiting room's options and numbers",
          rooms.get_room, response=RoomStats, errors=(400, 404)),
    Route("DELETE", ROOM, "deleteRoom", R, "admin", "Delete a waiting room, its fans and tokens",
          rooms.delete_room, status=204, errors=(400, 404)),
    Route("POST", f"{ROOM}/join", "joinRoom", R, "send",
          "Put a fan in line (joining again keeps the first ticket and place)", rooms.join,
          body=rooms.JoinRequest, response=Ticket, errors=(400, 404, 422),
          description="For an app that knows who its fans are; the fans' own page is "
          "`/rooms/{room}`. After sold out or close the answer is that state, with no "
          "ticket."),
    Route("GET", f"{ROOM}/status", "roomStatus", R, "receive",
          "Where a ticket stands; an admitted fan's status carries its admission token",
          rooms.status, query=rooms.StatusQuery, response=Status, errors=(400, 404, 422)),
    Route("POST", f"{ROOM}/verify", "verifyAdmission", R, "receive",
          "Check an admission token (`consume`: and burn it, it works once)", rooms.verify,
          body=rooms.VerifyRequest, response=rooms.Claims, errors=(400, 403, 404, 422),
          description="A forged, altered, expired, other room's or used token answers 403 "
          "`invalid_token`. Gateways may also verify offline with `/rooms/{room}/jwks.json`."),
    Route("POST", f"{ROOM}/admit", "admitFans", R, "admin",
          "Admit the next `n` waiting fans at once, whatever the rate", rooms.admit,
          body=rooms.AdmitRequest, response=rooms.Admitted, errors=(400, 404, 422),
          description="Answers how many were admitted; none before the room opens."),
    Route("PUT", f"{ROOM}/rate", "setRoomRate", R, "admin",
          "Change the admit rate live (fans per second), for the admitter wherever it runs",
          rooms.set_rate, body=rooms.RateRequest, response=RoomStats,
          errors=(400, 404, 422)),
    Route("POST", f"{ROOM}/sold-out", "roomSoldOut", R, "admin",
          "Sell out: everyone waiting, and every later join, is answered `sold_out`",
          rooms.sold_out, response=rooms.SoldOut, errors=(400, 404)),
    Route("POST", f"{ROOM}/close", "closeRoom", R, "admin",
          "Close the room: the sale is over and `RequireAdmission` stops guarding",
          rooms.close, response=RoomStats, errors=(400, 404)),
    # idempotency keys and version gates
    Route("POST", f"{IKEY}/claim", "claimKey", ID, "receive",
          "Claim an idempotency key for `lease` seconds: a claim token, or what holds it",
          idem.claim, body=idem.ClaimRequest, response=idem.ClaimResult, errors=E_Q,
          description="Of concurrent claims of one key exactly one gets a token; the others "
          "get `claimed: false` and the record in the way (running, or completed with its "
          "result). An expired claim can be taken again."),
    Route("POST", f"{IKEY}/complete", "completeClaim", ID, "receive",
          "Complete a claim with its result (the key is never claimed again within `ttl`)",
          idem.complete, body=idem.CompleteRequest, status=204, errors=(400, 409, 413, 422),
          description="409 `claim_lost` if another claimer took the key after this claim's "
          "lease ran out."),
    Route("POST", f"{IKEY}/release", "releaseClaim", ID, "receive",
          "Release a claim without completing it (the next claim takes the key at once)",
          idem.release, body=idem.TokenRequest, response=idem.Released, errors=E_Q),
    Route("POST", f"{IKEY}/extend", "extendClaim", ID, "receive",
          "Make a claim last `lease` seconds from now", idem.extend,
          body=idem.ExtendClaimRequest, status=204, errors=(400, 409, 422)),
    Route("GET", IKEY, "getIdempotencyKey", ID, "read",
          "A key's record: running or completed, until when, and the result",
          idem.get_key, response=idem.KeyRecord, errors=(400, 404)),
    Route("DELETE", IKEY, "forgetIdempotencyKey", ID, "admin",
          "Drop a key's record, running or completed, so the next claim takes it",
          idem.forget, status=204, errors=(400, 404)),
    Route("POST", "/v1/versions/{namespace}/{entity}/advance", "advanceVersion", ID, "receive",
          "Record a version if it is newer than the stored one (atomic)", idem.advance,
          body=idem.AdvanceRequest, response=idem.Advanced, errors=(400, 422),
          description="`advanced` is true only for a version greater than the stored one "
          "(or the first); an older or equal one changes nothing."),
    Route("GET", "/v1/versions/{namespace}/{entity}", "currentVersion", ID, "read",
          "An entity's stored version", idem.current, response=idem.VersionInfo,
          errors=(400, 404)),
    # the dashboard's live view
    Route("GET", "/v1/overview", "overview", D, "read",
          "Queues with measured rates and Little's-law worker counts, topics, attention "
          "domains: everything the dashboard shows", overview, response=m.Overview),
    # the server
    Route("GET", "/healthz", "healthz", "server", "public",
          "Health: 200 when the server and its backend answer", healthz, response=m.Health,
          description="`backend` is the backend's kind (`sqlite`), or its URL (password "
          "masked) when the request carries a valid key or the server has none."),
    Route("GET", "/metrics", "metrics", "server", "read",
          "Prometheus metrics (text format 0.0.4), read fresh at each scrape", metrics,
          response=str),
)  # fmt: skip
