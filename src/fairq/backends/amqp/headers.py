"""What fairq keeps in AMQP headers, and how a delivery's headers become attributes.

fairq's own headers start with ``fairq-`` and are not shown as attributes: ``fairq-prior``
(deliveries that ended before this copy was published) and ``fairq-group``. RabbitMQ's
(``x-death``, ``x-delivery-count``, ``x-first-death-*``, ``x-last-death-*``) are not shown
either; a broker dead letter's newest ``x-death`` entry becomes the ``fairq.*`` attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["GROUP", "PRIOR", "attributes_of", "hidden", "text"]

PRIOR = "fairq-prior"
GROUP = "fairq-group"
_HIDDEN_PREFIX = "fairq-"
_RABBIT_HEADERS = ("x-death", "x-delivery-count", "x-first-death-", "x-last-death-")
_DEATH_REASONS = {
    "expired": "expired",
    "maxlen": "overflow",
    "rejected": "rejected",
    "delivery_limit": "max_attempts",
}


def hidden(key: str) -> bool:
    """A header that is fairq's or RabbitMQ's own, not an attribute."""
    return key.startswith(_HIDDEN_PREFIX) or key.startswith(_RABBIT_HEADERS)


def text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def attributes_of(
    headers: Mapping[str, Any], message_id: str, level_queues: frozenset[str]
) -> dict[str, str]:
    """The fairq attributes of a delivery: its own headers, plus the ``fairq.*`` dead-letter
    attributes when the broker dead-lettered it (the newest ``x-death`` entry)."""
    attrs = {k: text(v) for k, v in headers.items() if not hidden(k)}
    deaths = headers.get("x-death")
    if deaths:
        last = deaths[0]
        source = text(last.get("queue", ""))
        if source and source not in level_queues:  # the delay wheel's hops are not deaths
            reason = _DEATH_REASONS.get(text(last.get("reason", "")), "rejected")
            attrs["fairq.reason"] = reason
            attrs["fairq.source"] = source
            attrs.setdefault("fairq.original_id", message_id)
            attrs["fairq.attempts"] = str(
                int(headers.get(PRIOR, 0)) + int(headers.get("x-delivery-count", 0))
            )
    return attrs
