"""The JSON of the REST API: typed request and response models (msgspec).

The route table (:mod:`fairq.http.api`) names one of these per request body, query
string and response; the same types decode and check requests, encode responses and
generate the OpenAPI document (:mod:`fairq.http.openapi`), so the document cannot drift
from what the server does. Responses reuse the library's own dataclasses
(``QueueStats``, ``QueueConfig``, ``TopicStats``, ``AttentionStats``, ``KeyStats``,
``PublishResult``) where they exist.

Message bodies travel as JSON: on the way in, ``body`` is any JSON value — a string is
stored as UTF-8 text, anything else as JSON (with ``content-type: application/json``,
as ``Queue.send`` does), and ``encoding`` can force ``text``, ``json`` or ``base64`` (the
body is then a base64 string of raw bytes). On the way out, ``body`` is the stored bytes
as text when they are UTF-8 (``encoding: "text"``), else base64 (``encoding: "base64"``).

A schema node carrying ``x-fairq-limit`` gets its maximum from the server's
:class:`~fairq.http.api.Limits` when the document is built (batch size, long-poll wait).
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

import msgspec
import orjson
from msgspec import UNSET, Meta, Struct, UnsetType

from ..attention import AttentionConfig, AttentionStats, KeyStats, TenantStats
from ..errors import InvalidMessage
from ..message import JSON_CONTENT_TYPE, Outgoing, Received
from ..model.queues import MAX_COUNT_OPTION
from ..pubsub import PublishResult, Subscription, TopicStats
from ..queue import QueueConfig, QueueStats
from ..waitingroom import RoomStats

NAME_PATTERN = "^[A-Za-z0-9._:-]{1,200}$"
KEY_PATTERN = "^[A-Za-z0-9_.:-]{1,100}$"
MAX_INT = 2**53  # integers beyond this lose meaning in JSON clients and in SQLite

Name = Annotated[str, Meta(pattern=NAME_PATTERN, description="1-200 of A-Z a-z 0-9 . _ : -")]
Key = Annotated[str, Meta(pattern=KEY_PATTERN, description="1-100 of A-Z a-z 0-9 _ . : -")]
Seconds = Annotated[float, Meta(ge=0, le=1e12)]
PositiveSeconds = Annotated[float, Meta(gt=0, le=1e12)]
Tag = Annotated[str, Meta(min_length=1, max_length=128)]
Count = Annotated[int, Meta(ge=0, le=MAX_INT)]
Attributes = Annotated[
    dict[Annotated[str, Meta(min_length=1, max_length=128)], str],
    Meta(max_length=32, description="at most 32; keys 1-128 characters"),
]
Encoding = Literal["auto", "text", "json", "base64"]


def limit(name: str, **meta: Any) -> Meta:
    """A constraint whose maximum the server sets (see the module docstring)."""
    return Meta(extra_json_schema={"x-fairq-limit": name}, **meta)


# -- requests ------------------------------------------------------------------------------
class Request(Struct, forbid_unknown_fields=True, kw_only=True):
    """Base of request bodies: unknown fields are refused (a typo is a 422, not ignored)."""


class QueueOptions(Request, omit_defaults=True):
    """Options of ``declare_queue``; a field left out takes ``declare_queue``'s default
    (``dead_letter`` left out: ``<name>.dlq``; null: discard dead letters)."""

    visibility_timeout: PositiveSeconds | UnsetType = UNSET
    max_attempts: Annotated[int, Meta(ge=1, le=MAX_COUNT_OPTION)] | UnsetType | None = UNSET
    dead_letter: Name | UnsetType | None = UNSET
    retention: Annotated[float, Meta(gt=0, le=1e10)] | UnsetType = UNSET
    max_length: Annotated[int, Meta(ge=1, le=MAX_COUNT_OPTION)] | UnsetType | None = UNSET
    overflow: Literal["reject", "drop_oldest", "block"] | UnsetType = UNSET
    fifo: bool | UnsetType = UNSET
    max_priority: Annotated[int, Meta(ge=0, le=255)] | UnsetType = UNSET
    dedup_window: Seconds | UnsetType = UNSET
    freshness_slo: PositiveSeconds | UnsetType | None = UNSET

    def to_options(self) -> dict[str, Any]:
        return {f: v for f in self.__struct_fields__ if (v := getattr(self, f)) is not UNSET}


class OutgoingMessage(Request):
    """One message to send (the fields of ``Queue.send``)."""

    body: Any
    encoding: Encoding = "auto"
    attributes: Attributes | None = None
    delay: Seconds = 0.0
    priority: Annotated[int, Meta(ge=0, le=255)] = 0
    group: Tag | None = None
    dedup_id: Tag | None = None

    def to_outgoing(self) -> Outgoing:
        return Outgoing(
            json_string(decode_body(self.body, self.encoding), self.encoding),
            outgoing_attributes(self.attributes, self.body, self.encoding),
            self.delay,
            self.priority,
            self.group,
            self.dedup_id,
        )


class SendRequest(Request):
    """Messages to store all or none; ``timeout`` bounds the wait on a full queue with
    ``overflow="block"`` (0: answer 429 at once)."""

    messages: Annotated[list[OutgoingMessage], limit("max_batch", min_length=1)]
    timeout: Annotated[float, limit("max_wait", ge=0)] = 0.0


class PublishMessage(Request):
    """One message to publish (the fields of ``Topic.publish``)."""

    body: Any
    encoding: Encoding = "auto"
    attributes: Attributes | None = None
    routing_key: Annotated[str, Meta(max_length=255)] = ""
    dedup_id: Tag | None = None
    delay: Seconds = 0.0

    def to_outgoing(self) -> Outgoing:
        return Outgoing(
            json_string(decode_body(self.body, self.encoding), self.encoding),
            outgoing_attributes(self.attributes, self.body, self.encoding),
            self.delay,
            dedup_id=self.dedup_id,
            routing_key=self.routing_key,
        )


class PublishRequest(Request):
    """Messages to publish in one atomic step."""

    messages: Annotated[list[PublishMessage], limit("max_batch", min_length=1)]
    timeout: Annotated[float, limit("max_wait", ge=0)] = 0.0


class ReceiveRequest(Request):
    """Lease up to ``max_messages``; ``wait`` > 0 long-polls that many seconds."""

    max_messages: Annotated[int, limit("max_batch", ge=1)] = 1
    visibility_timeout: PositiveSeconds | None = None
    wait: Annotated[float, limit("max_wait", ge=0)] = 0.0


#: what ``receive`` hands out: the message id (16 hex digits) and the lease token
Receipt = Annotated[str, Meta(pattern=r"^[0-7][0-9a-f]{15}\.[0-9a-f]{1,16}$")]
Receipts = Annotated[list[Receipt], Meta(min_length=1)]


class AckRequest(Request):
    """Receipts to ack; the others of the batch are acked even when some are lost."""

    receipts: Annotated[Receipts, limit("max_receipts")]


class NackRequest(Request):
    """Give a delivery back, visible again after ``delay`` seconds; ``error`` (why the
    attempt failed) becomes the dead letter's ``fairq.detail`` if this nack dead-letters it
    (its last allowed attempt)."""

    receipt: Receipt
    delay: Seconds = 0.0
    error: Annotated[str, Meta(max_length=1000)] | None = None


class ExtendRequest(Request):
    """Make leases end ``seconds`` from now."""

    receipts: Annotated[Receipts, limit("max_receipts")]
    seconds: PositiveSeconds


class DeadLetterRequest(Request):
    """Move a delivery to the dead-letter queue at once."""

    receipt: Receipt
    reason: Annotated[str, Meta(min_length=1, max_length=1000)] = "rejected"


class RedriveRequest(Request):
    """Move dead letters, oldest first, to ``to`` (null: each one's source queue)."""

    to: Name | None = None
    limit: Count | None = None


class TopicOptions(Request):
    """Options of ``declare_topic``."""

    dedup_window: Seconds = 300.0


class SubscribeRequest(Request):
    """A subscription: SNS-style ``filter`` policy, AMQP ``routing`` pattern, ``push``
    URL (the server's ``--workers`` POST each message there), options of its queue."""

    filter: dict[str, Any] | None = None
    routing: Annotated[str, Meta(max_length=255)] | None = None
    push: Annotated[str, Meta(pattern="^https?://", max_length=2000)] | None = None
    queue_options: QueueOptions | None = None


class PlanModel(Struct, forbid_unknown_fields=True, kw_only=True):
    """A plan of an attention domain (see ``fairq.Plan``)."""

    max_concurrency: Annotated[int, Meta(ge=1, le=1_000_000)] = 1
    max_messages: Annotated[int, Meta(ge=1, le=MAX_INT)] = 50
    max_time: PositiveSeconds = 20.0
    rate: PositiveSeconds | None = None
    burst: Annotated[float, Meta(ge=1, le=1e12)] | None = None
    weight: Annotated[float, Meta(gt=0, le=1e6)] = 1.0


class AttentionOptions(Request):
    """Options of ``declare_attention`` (plans left out: basic, pro, enterprise)."""

    plans: dict[Name, PlanModel] | None = None
    default_plan: Name = "basic"
    work_queue: Annotated[str, Meta(min_length=1, max_length=200)] | None = None
    queue_options: QueueOptions | None = None
    slice_lease: PositiveSeconds = 30.0
    charge: Literal["time", "messages"] = "time"
    shards: Annotated[int, Meta(ge=1, le=1024)] = 1


class ResourceRequest(Request):
    """Set a key's plan, state and/or tenant; fields left out (or null) stay as they are."""

    plan: Name | None = None
    state: Literal["active", "paused", "maintenance", "disabled", "removed"] | None = None
    tenant: Key | None = None


# -- query strings -------------------------------------------------------------------------
class Query(Struct, kw_only=True, forbid_unknown_fields=False):
    """Base of query strings (unknown parameters are ignored)."""


class PrefixQuery(Query):
    prefix: Annotated[str, Meta(max_length=200)] = ""


class QueueListQuery(PrefixQuery):
    """One page of queues: at most ``limit``, by name, after ``cursor`` (the previous
    page's ``next_cursor``)."""

    limit: Annotated[int, Meta(ge=1, le=1000)] = 100
    cursor: Annotated[str, Meta(max_length=200)] | None = None


class PeekQuery(Query):
    limit: Annotated[int, Meta(ge=1, le=1000)] = 10


class KeysQuery(Query):
    top: Annotated[int, Meta(ge=1, le=1000)] = 50


class RemoveQuery(Query):
    purge: bool = False


class StreamQuery(Query):
    routing: Annotated[str, Meta(max_length=255)] | None = None
    filter: (
        Annotated[str, Meta(max_length=10_000, description="a filter policy as JSON")] | None
    ) = None
    buffer: Annotated[int, Meta(ge=1, le=10_000)] = 1000


# -- responses -----------------------------------------------------------------------------
class Message(Struct, kw_only=True):
    """A delivered (or peeked: ``receipt`` is empty) message."""

    id: str
    body: str
    encoding: Literal["text", "base64"]
    attributes: dict[str, str]
    attempt: int
    enqueued_at: float
    priority: int
    group: str | None
    receipt: str
    queue: str
    key: str | None = None


class QueueInfo(Struct, kw_only=True):
    name: str
    config: QueueConfig
    stats: QueueStats


class QueueList(Struct):
    """A page of queues; ``next_cursor`` (null on the last page) asks for the next."""

    queues: list[QueueInfo]
    next_cursor: str | None = None


class Ids(Struct):
    ids: list[str]


class Messages(Struct):
    messages: list[Message]


class AckResult(Struct):
    acked: int
    lost: list[str]


class ExtendResult(Struct):
    lost: list[str]


class Purged(Struct):
    purged: int


class Reconciled(Struct):
    signalled: int


class Redriven(Struct):
    moved: int


class SubscriptionInfo(Struct, kw_only=True):
    topic: str
    name: str
    queue: str
    filter: dict[str, Any] | None
    routing: str | None
    push: str | None


class SubscriptionList(Struct):
    subscriptions: list[SubscriptionInfo]


class TopicInfo(Struct, kw_only=True):
    name: str
    dedup_window: float
    stats: TopicStats
    subscriptions: list[SubscriptionInfo]


class TopicList(Struct):
    topics: list[TopicInfo]


class Published(Struct):
    results: list[PublishResult]


class AttentionConfigInfo(Struct, kw_only=True):
    plans: dict[str, PlanModel]
    default_plan: str
    work_queue: str
    queue_options: dict[str, Any]
    slice_lease: float
    charge: str = "time"
    shards: int = 1


class AttentionInfo(Struct, kw_only=True):
    name: str
    queue: str
    config: AttentionConfigInfo
    stats: AttentionStats


class AttentionList(Struct):
    domains: list[AttentionInfo]


class KeyList(Struct):
    keys: list[KeyStats]


class TenantList(Struct):
    """The busiest tenants over the last minute (by worker-time share, then backlog)."""

    tenants: list[TenantStats]


class QueueRow(Struct, kw_only=True):
    """A queue as the dashboard shows it, with rates measured by the server's sampler
    (messages per second over the last ``window`` seconds; null until two samples)."""

    name: str
    stats: QueueStats
    dead_letter: str | None
    dlq_depth: int | None
    is_dlq: bool
    send_rate: float | None
    ack_rate: float | None
    handling_time: float | None
    workers_needed: float | None


class DomainRow(Struct, kw_only=True):
    name: str
    stats: AttentionStats
    keys: list[KeyStats]
    tenants: list[TenantStats] = []


class Overview(Struct, kw_only=True):
    """Everything the dashboard's live view shows, in one answer (``rooms``: the waiting
    rooms, empty when the ``room`` extra is not installed)."""

    time: float
    backend: str
    auth: bool
    window: float
    sampled_queues: int
    total_queues: int
    queues: list[QueueRow]
    topics: list[TopicInfo]
    attention: list[DomainRow]
    rooms: list[RoomStats]


class History(Struct, kw_only=True):
    """A queue's samples over the last minutes, as columns (``t`` in seconds since the
    epoch; rates in messages per second between consecutive samples)."""

    queue: str
    interval: float
    t: list[float]
    visible: list[int]
    in_flight: list[int]
    delayed: list[int]
    oldest_age: list[float]
    dlq_depth: list[int]
    send_rate: list[float]
    ack_rate: list[float]


class Health(Struct):
    """``backend``: the backend's kind, or its URL (password masked) for a caller with a
    valid key (or any caller of a server without keys)."""

    status: str
    backend: str


class Error(Struct, omit_defaults=True):
    """Every error answer: a stable ``error`` code and a human ``detail``; for some errors
    the fields the same exception carries in-process (the Python client sets them again):
    ``name`` (the queue, topic, domain or room not found, or the full queue),
    ``max_length`` and ``overflow`` (a full queue), ``lost`` (the receipts whose lease was
    gone), ``key`` (a lost idempotency claim)."""

    error: str
    detail: str
    name: str | None = None
    max_length: int | None = None
    overflow: str | None = None
    lost: list[str] | None = None
    key: str | None = None


# -- conversions ---------------------------------------------------------------------------
def decode_body(body: Any, encoding: Encoding) -> object:
    """The value to hand to ``send``: str (stored as text), bytes, or a JSON value."""
    if encoding == "base64":
        if not isinstance(body, str):
            raise InvalidMessage("with encoding 'base64' the body must be a base64 string")
        try:
            return base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidMessage(f"body is not valid base64: {exc}") from exc
    if encoding == "text" and not isinstance(body, str):
        raise InvalidMessage("with encoding 'text' the body must be a string")
    return body


def outgoing_attributes(
    attributes: dict[str, str] | None, body: Any, encoding: Encoding
) -> dict[str, str] | None:
    """A string body sent with ``encoding: "json"`` is JSON: mark it so."""
    if encoding == "json" and isinstance(body, str):
        return {**(attributes or {}), "content-type": JSON_CONTENT_TYPE}
    return attributes


def json_string(body: Any, encoding: Encoding) -> object:
    return orjson.dumps(body) if encoding == "json" and isinstance(body, str) else body


def message(m: Received) -> Message:
    try:
        text, encoding = m.body.decode("utf-8"), "text"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(m.body).decode("ascii"), "base64"
    return Message(
        id=m.id,
        body=text,
        encoding=encoding,  # type: ignore[arg-type]
        attributes=m.attributes,
        attempt=m.attempt,
        enqueued_at=m.enqueued_at,
        priority=m.priority,
        group=m.group,
        receipt=m.receipt,
        queue=m.queue,
        key=m.key,
    )


def subscription(s: Subscription) -> SubscriptionInfo:
    return SubscriptionInfo(
        topic=s.topic,
        name=s.name,
        queue=s.queue,
        filter=None if s.filter is None else dict(s.filter),
        routing=s.routing,
        push=s.push,
    )


def attention_config(c: AttentionConfig) -> AttentionConfigInfo:
    return AttentionConfigInfo(
        plans={
            n: PlanModel(
                max_concurrency=p.max_concurrency,
                max_messages=p.max_messages,
                max_time=p.max_time,
                rate=p.rate,
                burst=p.burst,
                weight=p.weight,
            )
            for n, p in c.plans.items()
        },
        default_plan=c.default_plan,
        work_queue=c.work_queue,
        queue_options=dict(c.queue_options),
        slice_lease=c.slice_lease,
        charge=c.charge,
        shards=c.shards,
    )


_encoder = msgspec.json.Encoder()


def encode(value: Any) -> bytes:
    """JSON bytes of a response model."""
    return _encoder.encode(value)
