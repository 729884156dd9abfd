"""Idempotency keys and version gates under ``/v1`` (SPEC §7): their models and handlers;
the rows of the route table are in :data:`fairq.http.api.ROUTES`.

A consumer in any language claims a key before doing the work it stands for and gets a
claim token; with that token it completes the claim (with a result, kept for ``ttl``),
releases it (the next claimer may try at once) or extends its lease. Of any number of
concurrent claims exactly one gets a token; the others learn what holds the key (running
or completed, with its result). Version gates answer whether a version is newer than the
stored one, atomically. Each call is one call of :class:`fairq.IdempotencyStore`,
:class:`fairq.Claim` or :class:`fairq.VersionGate`.

Results travel as JSON: any JSON value, or raw bytes as a base64 string with
``"encoding": "base64"`` (a result stored as bytes is read back that way, as are the
responses the ``Idempotency-Key`` header keeps).

:class:`IdempotentCall` puts ``POST /v1/queues/{queue}/messages`` and ``POST
/v1/topics/{topic}/messages`` (the routes marked ``idempotent``) under
:class:`~fairq.http.IdempotencyMiddleware` when a request carries ``Idempotency-Key``:
the same middleware, not a second implementation, once the request is authenticated.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from msgspec import Meta, Struct
from starlette.requests import Request as StarletteRequest
from starlette.responses import Response

from ..errors import InvalidMessage
from ..idempotency import DEFAULT_LEASE, Claim, IdempotencyRecord, IdempotencyStore
from ..message import check_key
from .errors import ApiError
from .middleware import IdempotencyMiddleware, Receive, Scope, Send
from .models import PositiveSeconds, Request

if TYPE_CHECKING:
    from .api import Call

__all__ = [
    "AdvanceRequest",
    "Advanced",
    "ClaimRequest",
    "ClaimResult",
    "CompleteRequest",
    "ExtendClaimRequest",
    "IdempotentCall",
    "KeyRecord",
    "Released",
    "TokenRequest",
    "VersionInfo",
]

#: what ``claim`` hands out, to complete, release or extend the claim with
# a holder's: 18 + 300 characters; never NUL (no engine's text holds it alike)
ClaimToken = Annotated[str, Meta(min_length=1, max_length=318, pattern="^[^\x00]+$")]
Lease = Annotated[float, Meta(gt=0, le=1e9, description="seconds")]
Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
AwareDatetime = Annotated[datetime, Meta(tz=True, description="an event time (RFC 3339)")]


# -- models ----------------------------------------------------------------------------------
class ClaimRequest(Request):
    """Take the key for ``lease`` seconds. ``holder`` names the unit of work (a message's
    queue and id): its own running claim is given back to it, so a redelivered message
    whose worker died mid-work gets its key back at once."""

    lease: Lease = DEFAULT_LEASE
    holder: Annotated[str, Meta(min_length=1, max_length=300)] | None = None


class KeyRecord(Struct, kw_only=True):
    """What holds a key: ``running`` (a claim, until ``expires_at``) or ``completed`` (kept
    until ``expires_at``), the claimer's ``fingerprint`` and the completed ``result``."""

    namespace: str
    key: str
    state: Literal["running", "completed"]
    expires_at: float
    fingerprint: str | None
    result: Any
    encoding: Literal["json", "base64"]


class ClaimResult(Struct, kw_only=True):
    """``claimed``: the key is yours under ``token`` until ``expires_at`` unless completed,
    released or extended; else ``record`` says what holds it."""

    claimed: bool
    token: str | None = None
    expires_at: float | None = None
    record: KeyRecord | None = None


class TokenRequest(Request):
    """The token ``claim`` answered."""

    token: ClaimToken


class CompleteRequest(Request):
    """Mark the work done, with ``result`` kept (and the key never claimed again) for
    ``ttl`` seconds."""

    token: ClaimToken
    result: Any = None
    encoding: Literal["json", "base64"] = "json"
    ttl: PositiveSeconds = 86_400.0


class ExtendClaimRequest(Request):
    """Make the claim last ``lease`` seconds from now."""

    token: ClaimToken
    lease: Lease = DEFAULT_LEASE


class Released(Struct):
    """False: the claim was no longer this token's (lost, completed or released)."""

    released: bool


class AdvanceRequest(Request):
    """A version: an integer (version, revision, sequence number), a number, or an event
    time with its time zone."""

    version: Int64 | float | AwareDatetime


class Advanced(Struct):
    """True only if the version was newer than the stored one (and is now stored)."""

    advanced: bool


class VersionInfo(Struct, kw_only=True):
    """An entity's stored version (event times as seconds since the epoch)."""

    namespace: str
    entity: str
    version: int | float


# -- idempotency ------------------------------------------------------------------------------
def _store(c: Call, ttl: float = 86_400.0) -> IdempotencyStore:
    return c.broker.idempotency(c.path["namespace"], ttl)


def _claim(c: Call, token: str, lease: float = DEFAULT_LEASE, ttl: float = 86_400.0) -> Claim:
    """The claim of the path's key under ``token``, as ``claim`` made it."""
    return Claim(_store(c, ttl), check_key(c.path["key"], "idempotency key"), token, lease)


def key_record(namespace: str, record: IdempotencyRecord) -> KeyRecord:
    result = record.result
    encoding: Literal["json", "base64"] = "json"
    if isinstance(result, bytes):
        result, encoding = base64.b64encode(result).decode("ascii"), "base64"
    return KeyRecord(
        namespace=namespace,
        key=record.key,
        state=record.state,
        expires_at=record.expires_at,
        fingerprint=record.fingerprint,
        result=result,
        encoding=encoding,
    )


async def claim(c: Call) -> ClaimResult:
    body: ClaimRequest = c.body
    store = _store(c)
    got = await store.try_claim(c.path["key"], body.lease, holder=body.holder)
    if isinstance(got, Claim):
        expires_at = c.broker.clock.now() + got.lease
        return ClaimResult(claimed=True, token=got.token, expires_at=expires_at)
    return ClaimResult(claimed=False, record=key_record(store.namespace, got))


async def complete(c: Call) -> None:
    body: CompleteRequest = c.body
    result: object = body.result
    if body.encoding == "base64":
        if not isinstance(result, str):
            raise InvalidMessage("with encoding 'base64' the result must be a base64 string")
        try:
            result = base64.b64decode(result, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidMessage(f"result is not valid base64: {exc}") from exc
    await _claim(c, body.token, ttl=body.ttl).complete(result)


async def release(c: Call) -> Released:
    body: TokenRequest = c.body
    return Released(await _claim(c, body.token).release())


async def extend(c: Call) -> None:
    body: ExtendClaimRequest = c.body
    await _claim(c, body.token, body.lease).extend()


async def get_key(c: Call) -> KeyRecord:
    store = _store(c)
    record = await store.get(c.path["key"])
    if record is None:
        raise ApiError(
            404, "not_found", f"idempotency key {c.path['key']!r} has no record in {store.name!r}"
        )
    return key_record(store.namespace, record)


async def forget(c: Call) -> None:
    store = _store(c)
    if not await store.forget(c.path["key"]):
        raise ApiError(
            404, "not_found", f"idempotency key {c.path['key']!r} has no record in {store.name!r}"
        )


# -- version gates ----------------------------------------------------------------------------
async def advance(c: Call) -> Advanced:
    body: AdvanceRequest = c.body
    gate = c.broker.versions(c.path["namespace"])
    return Advanced(await gate.advance(c.path["entity"], body.version))


async def current(c: Call) -> VersionInfo:
    gate = c.broker.versions(c.path["namespace"])
    entity = c.path["entity"]
    version = await gate.current(entity)
    if version is None:
        raise ApiError(404, "not_found", f"entity {entity!r} has no version in {gate.name!r}")
    return VersionInfo(namespace=gate.name, entity=entity, version=version)


# -- the Idempotency-Key header on /v1 sends and publishes ------------------------------------
#: where the header's keys are kept, and for how long (a repeat within it is replayed)
HEADER_NAMESPACE = "fairq.http"
HEADER_TTL = 86_400.0
_INSIDE = "fairq.idempotency_key"  # scope mark: this request already holds its key


def _kept(status: int) -> bool:
    """Whether an answer is kept for the key's repeats. A send or publish is atomic, so an
    answer of 4xx (a full queue, a queue not there yet, a value refused) or 503 (the engine
    away) stored nothing: not kept, and the retry runs again (once the queue is declared,
    say); a success and any other 5xx (the work may have had effects) are kept."""
    return not (400 <= status < 500 or status == 503)


class IdempotentCall(Response):
    """The answer of a route with ``idempotent=True`` to a request carrying an
    ``Idempotency-Key``: when Starlette sends it, the endpoint runs again inside
    :class:`~fairq.http.IdempotencyMiddleware` (SPEC §7) — the first request runs and its
    answer is kept, a repeat gets it replayed with ``Idempotent-Replayed: true``, a repeat
    still running gets 409 and another request with the key 422. Keys belong to the
    caller (``owner``, the API key's label), so no client replays another's answer."""

    def __init__(
        self,
        request: StarletteRequest,
        owner: str,
        endpoint: Callable[[StarletteRequest], Awaitable[Response]],
    ) -> None:
        super().__init__(status_code=200)
        self._broker = request.app.state.fairq.broker
        self._owner = owner
        self._endpoint = endpoint

    @staticmethod
    def wanted(request: StarletteRequest) -> bool:
        """True if the request carries the header and is not yet run by the middleware."""
        return "idempotency-key" in request.headers and not request.scope.get(_INSIDE)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def run(scope: Scope, receive: Receive, send: Send) -> None:
            scope[_INSIDE] = True
            response = await self._endpoint(StarletteRequest(scope, receive))
            await response(scope, receive, send)

        middleware = IdempotencyMiddleware(
            run,
            self._broker.idempotency(HEADER_NAMESPACE, HEADER_TTL),
            partition=lambda _scope: self._owner,
            store_response=_kept,
        )
        await middleware(scope, receive, send)
