"""How fairq's errors cross HTTP, in both directions — the one table of it.

Every answer that is not a success is JSON ``{"error": code, "detail": text}``. The
server finds the code and status of a :class:`fairq.FairqError` by walking the
exception's class hierarchy up to the nearest class in :data:`ERRORS`, so a new subclass
inherits its parent's answer; the client (:mod:`fairq.http.client`) turns a code back
into the same exception class.

Bad input is always 4xx: ``400`` malformed (bad JSON, bad name, bad receipt), ``401`` no
or unknown API key, ``403`` a key without the scope, ``404`` no such queue/topic/domain
or route, ``405`` wrong method, ``409`` a conflict with the current state (lease lost,
option that cannot change), ``413`` too large, ``422`` well-formed but not acceptable,
``429`` a bounded queue is full (retry later). Only a failing engine answers ``503``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from .. import errors as e
from ..idempotency import ClaimLost
from ..push import PushFailed

__all__ = [
    "CARRIED",
    "ERRORS",
    "PROTOCOL_ERRORS",
    "ApiError",
    "ErrorCode",
    "RemoteError",
    "RemoteInvalid",
    "RemoteUnavailable",
    "carried",
    "error_for",
    "exception_from",
]


class ErrorCode(NamedTuple):
    """The answer for one error class: HTTP status and the ``error`` code of the body."""

    status: int
    code: str


#: error class → (status, code); the nearest class in an exception's MRO wins
ERRORS: dict[type[Exception], ErrorCode] = {
    e.FairqError: ErrorCode(500, "internal"),
    e.InvalidName: ErrorCode(400, "invalid_name"),
    e.InvalidMessage: ErrorCode(422, "invalid_message"),
    e.MessageTooLarge: ErrorCode(413, "message_too_large"),
    e.InvalidOption: ErrorCode(422, "invalid_option"),
    e.ConfigConflict: ErrorCode(409, "config_conflict"),
    e.InvalidFilter: ErrorCode(422, "invalid_filter"),
    e.QueueNotFound: ErrorCode(404, "queue_not_found"),
    e.TopicNotFound: ErrorCode(404, "topic_not_found"),
    e.AttentionNotFound: ErrorCode(404, "attention_not_found"),
    e.RoomNotFound: ErrorCode(404, "room_not_found"),
    e.InvalidTicket: ErrorCode(400, "invalid_ticket"),
    e.InvalidToken: ErrorCode(403, "invalid_token"),
    e.QueueFull: ErrorCode(429, "queue_full"),
    e.LeaseLost: ErrorCode(409, "lease_lost"),
    ClaimLost: ErrorCode(409, "claim_lost"),
    e.Unsupported: ErrorCode(422, "unsupported"),
    e.BackendError: ErrorCode(503, "backend_error"),
    e.ConnectionError: ErrorCode(503, "backend_unavailable"),
    e.Reject: ErrorCode(422, "rejected"),
    PushFailed: ErrorCode(502, "push_failed"),
    # what the errors module promises of every bad-input error: it is also a ValueError,
    # or a LookupError for something missing — so an error class added later and not
    # listed above still answers 4xx
    LookupError: ErrorCode(404, "not_found"),
    ValueError: ErrorCode(422, "invalid"),
}

#: codes the server answers that no fairq exception carries
PROTOCOL_ERRORS: dict[str, int] = {
    "bad_request": 400,  # malformed JSON, a query value of the wrong type
    "host_not_allowed": 400,  # a Host name the server does not answer to (DNS rebinding)
    "unauthorized": 401,
    "forbidden": 403,
    "cross_site_request": 403,  # a browser's cross-site change without a JSON body (CSRF)
    "not_found": 404,  # no such route, or a subscription/key that is not there
    "method_not_allowed": 405,
    "body_too_large": 413,
    "validation_error": 422,  # the JSON does not fit the operation's schema
    # the Idempotency-Key header (http/middleware.py): malformed; reused on another
    # request; its first request still running
    "idempotency_key_invalid": 400,
    "idempotency_key_reused": 422,
    "idempotency_key_in_use": 409,
    "client_gone": 499,  # the client closed a waiting request (nobody reads the answer)
    "server_busy": 503,  # too many streams, long polls and blocked sends at once
    "shutting_down": 503,  # a long poll or blocked send when the server began to stop
    "room_secret_missing": 503,  # a room made with secret= this server was not given
}


class ApiError(Exception):
    """An HTTP error answer with a code of :data:`PROTOCOL_ERRORS` (or any code/status)."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


def error_for(exc: BaseException) -> ErrorCode:
    """The status and code of ``exc``: its nearest class in :data:`ERRORS` other than the
    root ``FairqError`` (500 ``internal``, the last resort). A batch larger than a bounded
    queue is 422 ``queue_full``: no retry lets it in (a full queue is 429, retry later)."""
    if isinstance(exc, e.QueueFull) and exc.never_fits:
        return ErrorCode(422, "queue_full")
    for cls in type(exc).__mro__:
        if cls is e.FairqError:
            continue
        found = ERRORS.get(cls)
        if found is not None:
            return found
    return ERRORS[e.FairqError]


_BY_CODE = {v.code: k for k, v in ERRORS.items() if issubclass(k, e.FairqError)}


class RemoteError(e.FairqError):
    """An error answer from a fairq server that no fairq exception class stands for
    (``status`` and ``code`` say what it was)."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(f"{detail} (HTTP {status} {code})")
        self.status = status
        self.code = code


class RemoteInvalid(RemoteError, e.InvalidOption):
    """The server refused the request's values (``validation_error``, ``invalid``,
    ``bad_request``): an ``InvalidOption`` (so a ``ValueError``), as the same call raises
    in-process, with the answer's ``status`` and ``code``."""


class RemoteUnavailable(RemoteError, e.ConnectionError):
    """The server is stopping or has too many requests waiting (``503 shutting_down``,
    ``server_busy``): nothing was done; like an engine that is away, retry shortly."""


#: error codes of a request whose values the server refused
_INVALID = frozenset({"validation_error", "invalid", "bad_request"})
#: error codes of a request the server did not do for want of room or time: retry
_UNAVAILABLE = frozenset({"shutting_down", "server_busy"})


#: the attributes of fairq exceptions that error answers carry (``models.Error``)
CARRIED = ("name", "max_length", "overflow", "lost", "key")


def carried(exc: BaseException) -> dict[str, Any]:
    """The :data:`CARRIED` attributes ``exc`` has, JSON-ready."""
    out: dict[str, Any] = {}
    for field in CARRIED:
        value = getattr(exc, field, None)
        if isinstance(value, str | int) and not isinstance(value, bool):
            out[field] = value
        elif field == "lost" and isinstance(value, list | tuple):
            out[field] = [str(v) for v in value]
    return out


def exception_from(
    status: int, code: str, detail: str, fields: Mapping[str, Any] | None = None
) -> e.FairqError:
    """The fairq exception a client raises for an error answer: the class the server
    mapped to ``code`` (its message is the server's ``detail``), ``RemoteInvalid`` for
    values it refused, else ``RemoteError``."""
    cls = _BY_CODE.get(code)
    if code in _INVALID and (cls is None or cls is e.FairqError):
        return RemoteInvalid(status, code, detail)
    if code in _UNAVAILABLE:
        return RemoteUnavailable(status, code, detail)
    if cls is None or cls is e.FairqError:
        return RemoteError(status, code, detail)
    exc = cls.__new__(cls)  # skip the class's own __init__: the server already wrote it
    Exception.__init__(exc, detail)
    if isinstance(exc, e.LeaseLost):
        exc.lost = []
    for field in CARRIED:  # the attributes the exception has in-process
        if fields and fields.get(field) is not None:
            setattr(exc, field, list(fields[field]) if field == "lost" else fields[field])
    return exc
