"""Push subscriptions: deliver each message of a subscription by HTTP POST.

The worker runtime (``worker.push()``) consumes a push subscription's queue like any
other and hands each message to :func:`push_handler`: the body is POSTed to the
subscription's endpoint; a 2xx answer acks, anything else (or a timeout, or a refused
connection) raises, so the message is retried with backoff and dead-lettered after the
queue's ``max_attempts``, like any queue.

Request headers: ``Fairq-Message-Id``, ``Fairq-Attempt``, ``Fairq-Topic``,
``Fairq-Subscription``, ``Fairq-Routing-Key`` (if any), ``Content-Type`` (the message's
``content-type`` attribute, else ``application/octet-stream``), ``Fairq-Attributes``
(all attributes as ASCII JSON), and ``Fairq-Attr-<key>`` for each attribute whose key
and value are plain printable ASCII.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .errors import FairqError
from .message import Received

if TYPE_CHECKING:
    from .pubsub import Subscription

__all__ = ["PushFailed", "push_handler"]

_TOKEN = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")
_VALUE = re.compile(r"[\x20-\x7e]*")


class PushFailed(FairqError):
    """The endpoint of a push subscription did not answer 2xx (the message is retried)."""


def push_headers(sub: Subscription, msg: Received) -> dict[str, str]:
    """The HTTP headers of one push delivery."""
    attrs = msg.attributes
    headers = {
        "Content-Type": attrs.get("content-type", "application/octet-stream"),
        "Fairq-Message-Id": msg.id,
        "Fairq-Attempt": str(msg.attempt),
        "Fairq-Topic": sub.topic,
        "Fairq-Subscription": sub.name,
        "Fairq-Attributes": json.dumps(attrs, ensure_ascii=True, separators=(",", ":")),
    }
    if "fairq.routing_key" in attrs:
        headers["Fairq-Routing-Key"] = attrs["fairq.routing_key"]
    for key, value in attrs.items():
        if _TOKEN.fullmatch(key) and _VALUE.fullmatch(value):
            headers[f"Fairq-Attr-{key}"] = value
    return headers


def push_handler(
    sub: Subscription, client: Any, timeout: float
) -> Callable[[Received], Awaitable[None]]:
    """A worker handler that POSTs each message of ``sub`` with ``client`` (an
    ``httpx.AsyncClient``) and raises :class:`PushFailed` unless the answer is 2xx."""
    url = sub.push
    if url is None:
        raise ValueError(f"subscription {sub.name!r} is not a push subscription")

    async def deliver(msg: Received) -> None:
        response = await client.post(
            url, content=msg.body, headers=push_headers(sub, msg), timeout=timeout
        )
        if not 200 <= response.status_code < 300:
            raise PushFailed(f"{url} answered {response.status_code} to message {msg.id}")

    return deliver
