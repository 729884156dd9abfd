"""Messages: what goes in (:class:`Outgoing`), what comes out (:class:`Received`),
and the checks and encodings every backend shares.

* Bodies are bytes; ``str`` is stored as UTF-8 and any other value as JSON (with the
  attribute ``content-type: application/json``).
* Message ids are 64-bit integers that grow with send time — the milliseconds since
  the epoch shifted left 16 bits, plus a counter — written as 16 hex digits, so ids
  sort by send time as strings too, and a message's send time can be read off its id.
* A receipt names one delivery: the message id and the lease token of that delivery.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from .errors import InvalidMessage, InvalidName, InvalidOption

__all__ = [
    "JSON_CONTENT_TYPE",
    "MAX_ATTRIBUTES",
    "Outgoing",
    "Received",
    "check_key",
    "check_name",
    "encode_attributes",
    "encode_body",
    "format_id",
    "id_time",
    "make_receipt",
    "new_lease",
    "next_id_base",
    "parse_id",
    "parse_receipt",
    "storable_lease",
]

MAX_ATTRIBUTES = 32
MAX_ATTRIBUTE_KEY = 128
#: bytes of UTF-8 a message's attributes take at most, keys and values together: on every
#: engine alike (RabbitMQ carries them in one frame of at most 128 KiB; the others had no
#: bound at all, so attributes could carry 100 times max_message_bytes)
MAX_ATTRIBUTE_BYTES = 65_536
JSON_CONTENT_TYPE = "application/json"
MAX_NAME = 200  # characters of a queue, topic, subscription or domain name
_NAME = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_NAME}}}")
_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,100}")
_ID_SHIFT = 16


def check_number(name: str, value: object, *, minimum: float = 0.0, strict: bool = False) -> float:
    """``value`` as a float if it is a finite number >= ``minimum`` (> with ``strict``);
    else ``InvalidOption`` naming the option ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidOption(f"{name} must be a finite number, got {value!r}")
    if value < minimum or (strict and value == minimum):
        raise InvalidOption(f"{name} must be {'>' if strict else '>='} {minimum:g}, got {value!r}")
    return float(value)


def shown(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to about ``limit`` characters: what an error may echo of a
    client's input (a 5,000-character bad key is not sent back whole)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def check_name(name: object, what: str = "queue") -> str:
    """Return ``name`` if it is a valid queue/topic/subscription/domain name, else raise."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise InvalidName(
            f"invalid {what} name {shown(name)}: use 1-200 characters from A-Z a-z 0-9 . _ : -"
        )
    return name


#: characters of a free text fairq keeps (a dead letter's ``fairq.detail``)
MAX_DETAIL = 1000


def check_detail(what: str, value: object) -> str:
    """A free text fairq stores as a dead letter's ``fairq.detail`` (a dead-letter reason,
    a nack's error): a non-empty str of UTF-8 without NUL, cut to :data:`MAX_DETAIL`
    characters (``InvalidOption`` otherwise: no engine stores NUL or lone surrogates
    alike)."""
    if not isinstance(value, str) or not value or "\x00" in value:
        raise InvalidOption(f"{what} must be a non-empty string without NUL, got {shown(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidOption(f"{what} must be valid UTF-8 text, got {shown(value)}") from None
    return value[:MAX_DETAIL]


def safe_detail(text: str) -> str:
    """``text`` made storable by :func:`check_detail`: NUL and what UTF-8 cannot hold
    written as escapes (an exception's message may hold anything)."""
    text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return text or "?"


def check_key(key: object, what: str = "key") -> str:
    """Return ``key`` if it is a valid attention key or fan/event id, else raise."""
    if not isinstance(key, str) or _KEY.fullmatch(key) is None:
        raise InvalidName(
            f"invalid {what} {shown(key)}: use 1-100 characters from A-Z a-z 0-9 _ . : -"
        )
    return key


def encode_body(body: object) -> tuple[bytes, bool]:
    """Turn a user body into bytes; the flag says it was encoded as JSON."""
    if isinstance(body, bytes):
        return body, False
    if isinstance(body, str):
        return body.encode("utf-8"), False
    if isinstance(body, bytearray | memoryview):
        return bytes(body), False
    try:
        # NaN and infinities become null, as orjson writes them (docs/queues.md): walking
        # each body to refuse them cost 10x its encoding
        return orjson.dumps(body), True
    except TypeError as exc:
        raise InvalidMessage(
            f"cannot send a body of type {type(body).__name__}: use bytes, str or a "
            f"JSON-serialisable value ({exc})"
        ) from exc


def encode_attributes(attributes: Mapping[str, str] | None, json_body: bool) -> dict[str, str]:
    """Check user attributes (at most 32, keys 1-128 chars, str values) and add content-type."""
    if attributes is None:
        attrs: dict[str, str] = {}
    elif isinstance(attributes, Mapping):
        if len(attributes) > MAX_ATTRIBUTES:
            raise InvalidMessage(
                f"a message has at most {MAX_ATTRIBUTES} attributes, got {len(attributes)}"
            )
        attrs = {}
        for key, value in attributes.items():
            if not isinstance(key, str) or not 1 <= len(key) <= MAX_ATTRIBUTE_KEY:
                raise InvalidMessage(f"attribute keys are strings of 1-128 characters: {key!r}")
            if not isinstance(value, str):
                raise InvalidMessage(f"attribute {key!r} must be a str, got {type(value).__name__}")
            if "\x00" in key or "\x00" in value:  # PostgreSQL's text and JSON refuse it
                raise InvalidMessage(f"attribute {key!r} cannot contain NUL characters")
            attrs[key] = value
        size = sum(len(k.encode()) + len(v.encode()) for k, v in attrs.items())
        if size > MAX_ATTRIBUTE_BYTES:
            raise InvalidMessage(
                f"a message's attributes take at most {MAX_ATTRIBUTE_BYTES} bytes of UTF-8 "
                f"(keys and values), got {size}: put large data in the body"
            )
    else:
        raise InvalidMessage(f"attributes must be a dict of str to str, got {attributes!r}")
    if json_body and "content-type" not in attrs:
        if len(attrs) >= MAX_ATTRIBUTES:
            raise InvalidMessage(
                f"a JSON body adds the attribute content-type; at most {MAX_ATTRIBUTES - 1} "
                "user attributes fit beside it"
            )
        attrs["content-type"] = JSON_CONTENT_TYPE
    return attrs


def format_id(n: int) -> str:
    """The public form of a message id: 16 lowercase hex digits."""
    return f"{n:016x}"


def parse_id(message_id: str) -> int:
    """The integer behind a public message id."""
    try:
        return int(message_id, 16)
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(f"malformed message id {message_id!r}") from exc


def next_id_base(last: int, now: float) -> int:
    """The next free id after ``last`` at time ``now`` (ids never go backwards)."""
    return max(last + 1, int(now * 1000) << _ID_SHIFT)


def id_time(n: int) -> float:
    """The send time (seconds since the epoch, millisecond precision) encoded in an id."""
    return (n >> _ID_SHIFT) / 1000.0


def new_lease() -> int:
    """A fresh lease token: 62 bits from the operating system's CSPRNG, never 0. A
    receipt is what lets its holder ack, nack or extend a delivery, so the next one must
    not be predictable from earlier ones (a seeded Mersenne Twister is, after 624 outputs).
    """
    return secrets.randbits(62) | 1


def make_receipt(n: int, lease: int) -> str:
    """The receipt of one delivery of message ``n`` under lease token ``lease``."""
    return f"{n:016x}.{lease:x}"


#: message ids and the leases SQLite and PostgreSQL store are below this (signed 64 bits)
INT64_END = 1 << 63


def parse_receipt(receipt: str) -> tuple[int, int]:
    """``(message id, lease token)`` of a receipt; raise on a malformed one (a message id
    needs at most 63 bits, as every engine makes them)."""
    try:
        head, _, tail = receipt.partition(".")
        mid, lease = int(head, 16), int(tail, 16)
    except (AttributeError, TypeError, ValueError) as exc:
        raise InvalidMessage(f"malformed receipt {shown(receipt)}") from exc
    if not 0 <= mid < INT64_END:
        raise InvalidMessage(f"malformed receipt {shown(receipt)}: no such message id")
    return mid, lease


def storable_lease(lease: int) -> int:
    """A receipt's lease as SQLite and PostgreSQL compare it: one that does not fit their
    signed 64 bits (fairq made none: theirs have 62) becomes 0, which no lease is, so the
    receipt is simply not a current lease."""
    return lease if 0 <= lease < INT64_END else 0


class LeaseHolder(Protocol):
    """What a :class:`Received` settles its lease through: the queue handle it came from
    (``fairq.queue.Queue``), which speaks to the backend."""

    async def _ack_one(self, receipt: str, connection: object | None = None) -> None: ...
    async def _nack(self, receipt: str, delay: float, error: str | None = None) -> None: ...
    async def _extend_one(self, receipt: str, seconds: float) -> None: ...
    async def _dead_letter(self, receipt: str, reason: str) -> None: ...


@dataclass(slots=True)
class Outgoing:
    """One message of ``Queue.send_batch`` or ``Topic.publish_batch``; the fields mirror
    ``send``'s arguments (and ``publish``'s ``routing_key``)."""

    body: Any
    attributes: Mapping[str, str] | None = None
    delay: float = 0.0
    priority: int = 0
    group: str | None = None
    dedup_id: str | None = None
    routing_key: str = ""  # used by Topic.publish_batch only


class Received:
    """A delivered message, leased to this receiver until ``ack``/``nack`` or lease expiry.

    ``attempt`` counts deliveries (the first is 1); ``receipt`` names this delivery and is
    what ``ack``, ``nack``, ``extend`` and ``dead_letter`` present to the backend.
    """

    __slots__ = (
        "_queue",
        "attempt",
        "attributes",
        "body",
        "enqueued_at",
        "group",
        "id",
        "key",
        "priority",
        "queue",
        "receipt",
    )

    def __init__(
        self,
        id: str,
        body: bytes,
        attributes: dict[str, str],
        attempt: int,
        enqueued_at: float,
        priority: int,
        group: str | None,
        receipt: str,
        queue: str,
        key: str | None = None,
    ) -> None:
        self.id = id
        self.body = body
        self.attributes = attributes
        self.attempt = attempt
        self.enqueued_at = enqueued_at
        self.priority = priority
        self.group = group
        self.receipt = receipt
        self.queue = queue
        self.key = key
        self._queue: LeaseHolder | None = None

    def __repr__(self) -> str:
        return (
            f"Received(id={self.id!r}, queue={self.queue!r}, attempt={self.attempt}, "
            f"body={self.body[:40]!r}{'...' if len(self.body) > 40 else ''})"
        )

    def json(self) -> Any:
        """Decode the body as JSON."""
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError as exc:
            raise InvalidMessage(f"message {self.id} has no JSON body: {exc}") from exc

    def text(self) -> str:
        """Decode the body as UTF-8."""
        return self.body.decode("utf-8")

    def _handle(self) -> LeaseHolder:
        if self._queue is None:
            raise InvalidOption("this message is not attached to a queue handle")
        return self._queue

    async def ack(self, connection: object | None = None) -> None:
        """Delete the message: it was handled. Raises ``LeaseLost`` if the lease is gone.

        ``connection`` (PostgreSQL): the caller's own psycopg ``AsyncConnection`` inside its
        transaction — the ack commits with the caller's writes, or not at all (the inbox);
        other backends raise ``Unsupported``."""
        await self._handle()._ack_one(self.receipt, connection)

    async def nack(self, delay: float = 0.0, *, error: str | None = None) -> None:
        """Give the message back, visible again after ``delay`` seconds (or dead-lettered
        if this was delivery number ``max_attempts``). ``error`` says why this attempt
        failed: a dead letter made by this nack keeps it as ``fairq.detail`` (a
        :class:`~fairq.Worker` passes its handler's exception)."""
        await self._handle()._nack(self.receipt, delay, error)

    async def extend(self, seconds: float) -> None:
        """Keep the lease: the message stays hidden until ``seconds`` from now."""
        await self._handle()._extend_one(self.receipt, seconds)

    async def dead_letter(self, reason: str = "rejected") -> None:
        """Move the message to the dead-letter queue at once."""
        await self._handle()._dead_letter(self.receipt, reason)
