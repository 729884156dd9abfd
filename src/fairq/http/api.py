"""The REST API ``/v1``: one table of routes, each with its handler and its types.

:data:`ROUTES` is the single source of the API: :func:`fairq.http.app.create_app` mounts
it, :mod:`fairq.http.openapi` turns it into ``/openapi.json`` and ``docs/http-api.md``.
A :class:`Route` names its method, path, required scope, request body, query and
response models (:mod:`fairq.http.models`); its handler gets a :class:`Call` with the
decoded, checked values and returns a response model (or None for ``204``). The queue,
dashboard and server handlers are here; topics, attention domains, waiting rooms and
idempotency have a module each (``api_topics``, ``api_attention``, ``api_rooms``,
``api_idempotency``), and what they all share is in :mod:`fairq.http.calls`.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import msgspec
from starlette.responses import Response

from ..attention import KeyStats
from ..broker import Broker
from ..errors import ConnectionError, QueueNotFound
from ..message import check_name
from ..waitingroom import RoomStats, Status, Ticket
from . import api_attention as att
from . import api_idempotency as idem
from . import api_rooms as rooms
from . import api_topics as topics
from . import models as m
from .calls import PATH_PARAMS, Call, Limits, Route, ServerState, check_batch, check_wait

__all__ = ["PATH_PARAMS", "ROUTES", "Call", "Limits", "Route", "ServerState"]


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
    check_batch(c, len(body.messages))
    check_wait(c, body.timeout)
    q = c.broker.queue(c.path["queue"])
    return m.Ids(await q.send_batch([o.to_outgoing() for o in body.messages], body.timeout))


async def receive(c: Call) -> m.Messages:
    body: m.ReceiveRequest = c.body
    check_batch(c, body.max_messages)
    check_wait(c, body.wait)
    q = c.broker.queue(c.path["queue"])
    got = await q.receive(body.max_messages, body.visibility_timeout, body.wait)
    if got and c.gone is not None and c.gone.is_set():
        # the client left while the engine leased these: nobody would get them, and each
        # would count an attempt at the end of its lease; they go back at once, uncounted
        await q.release_batch([x.receipt for x in got])
        return m.Messages([])
    return m.Messages([m.message(x) for x in got])


async def peek(c: Call) -> m.Messages:
    query: m.PeekQuery = c.query
    got = await c.broker.queue(c.path["queue"]).peek(query.limit)
    return m.Messages([m.message(x) for x in got])


async def ack(c: Call) -> m.AckResult:
    body: m.AckRequest = c.body
    check_batch(c, len(body.receipts), "max_receipts")
    backend = c.broker.backend
    name = check_name(c.path["queue"])
    receipts = list(dict.fromkeys(body.receipts))  # a receipt named twice acks one message
    lost = await backend.ack(name, receipts)
    return m.AckResult(len(receipts) - len(lost), lost)


async def nack(c: Call) -> None:
    body: m.NackRequest = c.body
    await c.broker.queue(c.path["queue"])._nack(body.receipt, body.delay, body.error)


async def extend(c: Call) -> m.ExtendResult:
    body: m.ExtendRequest = c.body
    check_batch(c, len(body.receipts), "max_receipts")
    lost = await c.broker.queue(c.path["queue"]).extend_batch(body.receipts, body.seconds)
    return m.ExtendResult(lost)


async def release(c: Call) -> m.ExtendResult:
    body: m.AckRequest = c.body
    check_batch(c, len(body.receipts), "max_receipts")
    receipts = list(dict.fromkeys(body.receipts))
    return m.ExtendResult(await c.broker.queue(c.path["queue"]).release_batch(receipts))


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


# -- the dashboard's view and the server ---------------------------------------------------
async def overview(c: Call) -> m.Overview:
    view = await c.state.sampler.overview()
    return msgspec.structs.replace(view, auth=c.state.auth) if c.state.auth else view


#: seconds /healthz waits for the backend's engines before it answers 503
HEALTH_TIMEOUT = 5.0


async def healthz(c: Call) -> m.Health:
    try:  # every engine of the backend answers, soon: a probe must not hang for 30 s
        async with asyncio.timeout(HEALTH_TIMEOUT):
            await c.broker.backend.ping()
    except TimeoutError:
        raise ConnectionError(f"the backend did not answer within {HEALTH_TIMEOUT:g} s") from None
    # the URL names hosts, users, paths: only for callers who may read the server anyway
    url = c.broker.url
    return m.Health("ok", url if c.principal is not None else urlsplit(url).scheme)


async def metrics(c: Call) -> Response:
    from .metrics import CONTENT_TYPE

    snapshot = await c.state.sampler.fresh()
    readings = await c.state.metrics.read(c.broker, snapshot.stats, snapshot.total)
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
          "Peek at messages, oldest first (any state), without leasing them", peek,
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
    Route("POST", "/v1/queues/{queue}/release", "releaseMessages", Q, "receive",
          "Give deliveries back at once without counting an attempt", release,
          body=m.AckRequest, response=m.ExtendResult, errors=E_Q,
          description="For deliveries a consumer took but never started (it is shutting "
          "down). Receipts whose lease is gone are listed in `lost`."),
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
          "List topics with their stats and subscriptions", topics.list_topics,
          query=m.PrefixQuery, response=m.TopicList),
    Route("PUT", "/v1/topics/{topic}", "declareTopic", T, "admin",
          "Declare a topic (create, or update its options)", topics.declare_topic,
          body=m.TopicOptions, response=m.TopicInfo, errors=(400, 422)),
    Route("GET", "/v1/topics/{topic}", "getTopic", T, "read",
          "A topic's options, stats and subscriptions", topics.get_topic, response=m.TopicInfo,
          errors=(400, 404)),
    Route("DELETE", "/v1/topics/{topic}", "deleteTopic", T, "admin",
          "Delete a topic, its subscriptions and their queues (not their DLQs)",
          topics.delete_topic, status=204,
          errors=(400, 404)),
    Route("GET", "/v1/topics/{topic}/subscriptions", "listSubscriptions", T, "read",
          "A topic's subscriptions", topics.list_subscriptions, response=m.SubscriptionList,
          errors=(400, 404)),
    Route("PUT", "/v1/topics/{topic}/subscriptions/{subscription}", "subscribe", T, "admin",
          "Create or update a subscription (its queue is `<topic>.<subscription>`)",
          topics.subscribe, body=m.SubscribeRequest, response=m.SubscriptionInfo,
          errors=(400, 404, 409, 422)),
    Route("DELETE", "/v1/topics/{topic}/subscriptions/{subscription}", "unsubscribe", T,
          "admin", "Remove a subscription and delete its queue (not its DLQ)",
          topics.unsubscribe, status=204,
          errors=(400, 404)),
    Route("POST", "/v1/topics/{topic}/messages", "publishMessages", T, "send",
          "Publish a batch of messages to every matching subscription (all or none)",
          topics.publish, body=m.PublishRequest, response=m.Published,
          errors=(400, 404, 409, 413, 422, 429), idempotent=True),
    Route("GET", "/v1/topics/{topic}/stream", "streamTopic", T, "receive",
          "Listen live (Server-Sent Events): what is published from now on, at most once",
          topics.stream, query=m.StreamQuery, stream=True, errors=E_Q,
          description="Each message is an event `message` whose data is a Message (JSON) "
          "and whose id is the message id; a listener more than `buffer` messages behind "
          "loses the oldest, announced by an event `dropped` with the count so far. A "
          "comment line every 15 s keeps the connection alive. Sees what is published "
          "through this server process."),
    # attention
    Route("GET", "/v1/attention", "listAttention", A, "read",
          "List attention domains with their options and counters", att.list_attention,
          query=m.PrefixQuery, response=m.AttentionList),
    Route("PUT", "/v1/attention/{domain}", "declareAttention", A, "admin",
          "Declare an attention domain (create, or update its options)", att.declare_attention,
          body=m.AttentionOptions, response=m.AttentionInfo, errors=(400, 409, 422)),
    Route("GET", "/v1/attention/{domain}", "getAttention", A, "read",
          "An attention domain's options and counters", att.get_attention,
          response=m.AttentionInfo, errors=(400, 404)),
    Route("DELETE", "/v1/attention/{domain}", "deleteAttention", A, "admin",
          "Delete an attention domain's keys and signals (its work queues stay)",
          att.delete_attention, status=204, errors=(400, 404)),
    Route("POST", "/v1/attention/{domain}/reconcile", "reconcileAttention", A, "admin",
          "Signal every active key with backlog and no signal or running slice (lost "
          "signals); workers do this every `reconcile_interval`", att.reconcile,
          response=m.Reconciled, errors=(400, 404)),
    Route("GET", "/v1/attention/{domain}/keys", "attentionKeys", A, "read",
          "The busiest keys (by backlog, then in flight)", att.key_stats, query=m.KeysQuery,
          response=m.KeyList, errors=E_Q),
    Route("GET", "/v1/attention/{domain}/tenants", "attentionTenants", A, "read",
          "The busiest tenants over the last minute: worker-time share, slices, messages, "
          "backlog, at cap", att.tenant_stats, query=m.KeysQuery, response=m.TenantList,
          errors=E_Q),
    Route("GET", "/v1/attention/{domain}/keys/{key}", "getAttentionKey", A, "read",
          "One key's backlog, slices, plan, state and tenant", att.get_key,
          response=KeyStats, errors=(400, 404)),
    Route("PATCH", "/v1/attention/{domain}/keys/{key}", "setResource", A, "admin",
          "Set a key's plan, state and/or tenant", att.set_resource, body=m.ResourceRequest,
          response=KeyStats, errors=E_Q),
    Route("DELETE", "/v1/attention/{domain}/keys/{key}", "removeKey", A, "admin",
          "Mark a key removed (its signals are dropped); `purge` also empties its queue",
          att.remove_key, query=m.RemoveQuery, status=204, errors=E_Q),
    Route("POST", "/v1/attention/{domain}/keys/{key}/messages", "publishToKey", A, "send",
          "Publish work for a key (work messages and the key's signal, atomically)",
          att.attention_publish, body=m.SendRequest, response=m.Ids,
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
          description="A forged, altered, expired or other room's token answers 403 "
          "`invalid_token`; with `consume`, so does a used one. Without `consume` only the "
          "signature and times are checked, as offline (a used token still verifies): the "
          "call that must happen once, the purchase, consumes. Gateways may also verify "
          "offline with `/rooms/{room}/jwks.json`."),
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
