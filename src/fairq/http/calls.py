"""What every ``/v1`` handler works with: the request as a :class:`Call`, the server's
shared :class:`ServerState` and :class:`Limits`, a :class:`Route` of the table in
:data:`fairq.http.api.ROUTES`, and the checks of a request's size that handlers share.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.requests import Request

from . import models as m
from .auth import Principal, Scope
from .errors import ApiError

if TYPE_CHECKING:
    from ..broker import Broker
    from .metrics import Metrics
    from .sampler import Sampler

InfoT = TypeVar("InfoT")

__all__ = [
    "PATH_PARAMS",
    "Call",
    "Handler",
    "Limits",
    "Route",
    "ServerState",
    "check_batch",
    "check_wait",
    "infos",
]


#: bytes of JSON a message takes besides its body (fields, quotes, separators), counted
#: per message in the default body limit
_MESSAGE_OVERHEAD = 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """What one request may ask for. ``max_body`` None: room for ``max_batch`` messages of
    ``max_message_bytes`` sent as base64 (4/3 of their size) with their JSON around them."""

    max_batch: int = 100
    max_wait: float = 20.0
    max_receipts: int = 1000
    max_body: int | None = None

    def body_limit(self, max_message_bytes: int) -> int:
        if self.max_body is not None:
            return self.max_body
        # a binary body travels as base64; attributes and the message's JSON fields around it
        per_message = -(-max_message_bytes * 4 // 3) + _MESSAGE_OVERHEAD
        return per_message * self.max_batch

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
    #: set when the client closed its connection while the request waited
    #: (``waiting.WaitSlots.run``): what a long poll leased then is given back
    gone: asyncio.Event | None = None

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


def check_batch(c: Call, n: int, what: str = "max_batch") -> None:
    most = getattr(c.state.limits, what)
    if n > most:
        raise ApiError(422, "validation_error", f"at most {most} items per request, got {n}")


def check_wait(c: Call, seconds: float) -> None:
    if seconds > c.state.limits.max_wait:
        raise ApiError(
            422, "validation_error", f"wait at most {c.state.limits.max_wait:g} s, got {seconds:g}"
        )


async def infos(
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
