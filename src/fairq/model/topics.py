"""What a topic is, as handles and backends both see it: its options, its subscriptions
(and the index that matches a message to them), a publish's result and the counters."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..errors import InvalidOption
from ..filters import Filter, compile_filter
from ..message import check_name
from ..routing import RoutingIndex, check_pattern

__all__ = [
    "PublishResult",
    "Subscription",
    "SubscriptionIndex",
    "TopicConfig",
    "TopicStats",
    "check_subscription",
]


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """Options of a topic: ``dedup_window`` seconds during which a repeated ``dedup_id``
    publishes nothing and returns the first publish's result."""

    dedup_window: float = 300.0


@dataclass(frozen=True, slots=True)
class Subscription:
    """A subscription as the backend stores it. ``queue`` is ``<topic>.<name>``;
    ``filter`` is the policy as given (compiled where it is used), ``routing`` an AMQP
    topic pattern (None: every routing key), ``push`` an endpoint URL (None: pull)."""

    topic: str
    name: str
    queue: str
    filter: Mapping[str, Any] | None = None
    routing: str | None = None
    push: str | None = None


@dataclass(frozen=True, slots=True)
class PublishResult:
    """What a publish did: the publication's id and the subscriptions that got a copy;
    ``duplicate`` when a repeated ``dedup_id`` made it the first publish's answer (nothing
    was stored or delivered this time)."""

    message_id: str
    subscriptions: list[str] = field(default_factory=list)
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class TopicStats:
    """A topic's counters since it was declared: messages published, copies stored,
    publishes that matched no subscription, and the subscriptions it has now."""

    published: int = 0
    copies: int = 0
    unmatched: int = 0
    subscriptions: int = 0


class SubscriptionIndex:
    """Which subscriptions of a topic a message goes to, at a cost that does not grow with
    the number of subscriptions for exact routing keys and simple patterns: a trie over
    routing words narrows the candidates, then only their filters are evaluated."""

    _CACHE = 4096  # routing keys remembered (a publisher uses few distinct keys)

    def __init__(self, subscriptions: Iterable[Subscription]) -> None:
        self._routes: RoutingIndex[str] = RoutingIndex()
        self._filters: dict[str, Filter] = {}
        self._by_key: dict[str, list[str]] = {}
        for s in subscriptions:
            self._routes.add(s.routing, s.name)
            if s.filter is not None:
                self._filters[s.name] = compile_filter(s.filter)

    def match(self, routing_key: str, attributes: Mapping[str, str]) -> list[str]:
        """Names of the matching subscriptions, sorted."""
        routed = self._by_key.get(routing_key)
        if routed is None:
            if len(self._by_key) >= self._CACHE:
                self._by_key.clear()
            routed = self._by_key[routing_key] = sorted(self._routes.match(routing_key))
        filters = self._filters
        if not filters:
            return list(routed)
        return [n for n in routed if (f := filters.get(n)) is None or f.matches(attributes)]


def _is_push_url(push: object) -> bool:
    """An absolute http(s) URL with a host, that an HTTP client can send to as it is."""
    if not isinstance(push, str) or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in push):
        return False
    try:
        parts = urlsplit(push)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def check_subscription(topic: str, name: str, filter: Any, routing: Any, push: Any) -> Subscription:
    """Validate a subscription before the backend sees it (``InvalidFilter`` for a bad
    filter policy or routing pattern)."""
    check_name(name, "subscription")
    compile_filter(filter)
    if routing is not None:
        if not isinstance(routing, str):
            raise InvalidOption(f"routing must be a string pattern or None, got {routing!r}")
        check_pattern(routing)
    if push is not None and not _is_push_url(push):
        raise InvalidOption(
            f"push must be an http:// or https:// URL with a host and no spaces or control "
            f"characters, got {push!r}"
        )
    queue = check_name(f"{topic}.{name}", "subscription queue")
    # a copy: the caller's dict changed later must not change the subscription
    return Subscription(topic, name, queue, copy.deepcopy(filter), routing, push)
