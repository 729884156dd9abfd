"""Every error fairq raises, under one root.

    FairqError
    ├── ConnectionError        unknown scheme, unreachable server, wrong credentials
    ├── InvalidName            a queue/topic/key name outside the allowed alphabet or length
    │   └── InvalidTicket      a waiting-room ticket this room never issued
    ├── InvalidMessage         a body or attributes fairq cannot store
    │   └── MessageTooLarge    body over ``max_message_bytes``
    ├── InvalidOption          a bad option value (negative timeout, unknown overflow mode, ...)
    │   ├── ConfigConflict     an option that cannot change or cannot be combined
    │   └── InvalidFilter      a filter policy or routing pattern fairq cannot compile
    ├── QueueNotFound          a handle used on a queue that was never declared
    ├── TopicNotFound          a handle used on a topic that was never declared
    ├── AttentionNotFound      a handle used on an attention domain that was never declared
    ├── RoomNotFound           a waiting room that was never created
    ├── InvalidToken           a forged, altered, expired, used or other room's admission token
    ├── QueueFull              a bounded queue refused a send
    ├── LeaseLost              ack/nack/extend/dead_letter with a receipt that is no longer current
    ├── Unsupported            the backend cannot do this (see the capability table)
    ├── BackendError           the engine failed (disk full, I/O error, lock timeout...)
    └── Reject                 raised by a handler: dead-letter the message at once

Errors that are about bad input also subclass :class:`ValueError` (or
:class:`LookupError` for a missing queue) so generic handlers keep working.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence

__all__ = [
    "AttentionNotFound",
    "BackendError",
    "ConfigConflict",
    "ConnectionError",
    "FairqError",
    "InvalidFilter",
    "InvalidMessage",
    "InvalidName",
    "InvalidOption",
    "InvalidTicket",
    "InvalidToken",
    "LeaseLost",
    "MessageTooLarge",
    "QueueFull",
    "QueueNotFound",
    "Reject",
    "RoomNotFound",
    "TopicNotFound",
    "Unsupported",
]


class FairqError(Exception):
    """The root of every error fairq raises."""


class ConnectionError(FairqError, builtins.ConnectionError):
    """The backend could not be reached or refused the connection.

    The message names the URL with its password masked, and ``__cause__`` holds the
    driver's error.
    """


class InvalidName(FairqError, ValueError):
    """A name of a queue, topic, subscription, domain, key or id is not allowed."""


class InvalidTicket(InvalidName):
    """A waiting-room ticket that this room never issued (malformed, or its signature does
    not match: forged, altered, or from another room)."""


class InvalidMessage(FairqError, ValueError):
    """A body or attributes that fairq cannot store (wrong type, too many attributes...)."""


class MessageTooLarge(InvalidMessage):
    """The body is larger than ``max_message_bytes``; nothing was stored."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"message body is {size} bytes, the limit is {limit} bytes")
        self.size = size
        self.limit = limit


class InvalidOption(FairqError, ValueError):
    """An option has a value fairq does not accept."""


class ConfigConflict(InvalidOption):
    """Options that cannot be combined, or an option that cannot change on re-declare."""


class InvalidFilter(InvalidOption):
    """A filter policy or routing pattern is malformed; the message names the offending part.

    Raised when a subscription or listener is set up, never when a message is published.
    """


class QueueNotFound(FairqError, LookupError):
    """The queue was never declared (or was deleted)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"queue {name!r} does not exist; declare it with broker.declare_queue()")
        self.name = name


class TopicNotFound(FairqError, LookupError):
    """The topic was never declared (or was deleted)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"topic {name!r} does not exist; declare it with broker.declare_topic()")
        self.name = name


class AttentionNotFound(FairqError, LookupError):
    """The attention domain was never declared (or was deleted)."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"attention domain {name!r} does not exist; declare it with broker.declare_attention()"
        )
        self.name = name


class RoomNotFound(FairqError, LookupError):
    """The waiting room was never created (or was deleted)."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"waiting room {name!r} does not exist; create it with broker.waiting_room()"
        )
        self.name = name


class InvalidToken(FairqError, ValueError):
    """An admission token that must be refused: not a JWT, a bad signature (forged or
    altered), signed with another key, for another room, expired, or already used."""


#: the detail of a ``QueueFull`` for a batch that no wait would let in (every engine's)
BATCH_LARGER = "the batch is larger than max_length"


class QueueFull(FairqError):
    """A bounded queue (``max_length``) refused a send; nothing was stored.
    ``never_fits``: the batch is larger than ``max_length`` (retrying cannot help)."""

    detail = ""

    def __init__(
        self, name: str, max_length: int, detail: str = "", overflow: str = "reject"
    ) -> None:
        text = f"queue {name!r} is full (max_length={max_length})"
        super().__init__(f"{text}: {detail}" if detail else text)
        self.name = name
        self.max_length = max_length
        self.overflow = overflow
        self.detail = detail

    @property
    def never_fits(self) -> bool:
        return self.detail == BATCH_LARGER


class LeaseLost(FairqError):
    """The receipt is no longer the message's current lease; nothing was changed.

    ``lost`` lists the receipts that were refused (for ``ack_batch``, the others were acked).
    """

    def __init__(self, lost: Sequence[str], detail: str = "") -> None:
        text = detail or (
            "the lease of this delivery is no longer current (it expired, or the message "
            "was acked, nacked or redelivered)"
        )
        super().__init__(
            f"{text}; receipts: {', '.join(lost[:5])}{' ...' if len(lost) > 5 else ''}"
        )
        self.lost = list(lost)


class Unsupported(FairqError):
    """The backend in use cannot do this; see docs/backends.md for the capability table."""


class BackendError(FairqError):
    """The storage engine failed; ``__cause__`` holds the driver's error."""


class Reject(FairqError):
    """Raise from a handler to dead-letter the message at once (reason ``rejected``)."""

    def __init__(self, reason: str = "rejected") -> None:
        super().__init__(reason)
        self.reason = reason
