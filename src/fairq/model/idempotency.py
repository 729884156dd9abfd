"""What an idempotency store keeps, as handles and backends both see it: a key's record,
the stored form of a claim's result, and the versions a version gate compares."""

from __future__ import annotations

import dataclasses
import math
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import orjson

from ..errors import InvalidMessage, InvalidOption

__all__ = [
    "DEFAULT_LEASE",
    "IdempotencyRecord",
    "Version",
    "check_version",
    "decode_result",
    "encode_result",
    "holder_token",
    "same_holder",
]


#: seconds a claim lasts unless completed, released or extended
DEFAULT_LEASE = 60.0


# A claim's token. A claim without a holder has a random one (24 hex digits). A holder's
# claim has "@" + 16 random hex digits + "@" + the holder: the random part tells this claim
# from the same holder's earlier ones (whose late release or completion must then fail),
# and the part from character 19 on (1-based, as SQL's substr and Lua's string.sub count)
# says whose it is, so a holder's new claim takes back its own running one. Every engine
# compares the holder part by that rule, inside its atomic claim.
HOLDER_MARK = "@"
HOLDER_AT = 18  # 0-based index of the holder part


def holder_token(holder: str) -> str:
    """A new claim token of ``holder``: unique to this claim, its tail naming the holder."""
    return HOLDER_MARK + secrets.token_hex(8) + HOLDER_MARK + holder


def same_holder(stored: str, token: str) -> bool:
    """True if both tokens are holder tokens of one holder (a holder's claim may take its
    own running claim back)."""
    return (
        stored[:1] == HOLDER_MARK
        and token[:1] == HOLDER_MARK
        and stored[HOLDER_AT:] == token[HOLDER_AT:]
    )


#: a version as the backends store it: an integer (version, revision, sequence number) or
#: a float (an event time in seconds since the epoch)
Version = int | float


_INT64 = 2**63


# how a result is stored: one tag byte, then the payload (backends keep opaque bytes)
_BYTES, _JSON = b"b", b"j"


def _check_finite(value: object, data: bytes, what: str) -> None:
    """Raise ``InvalidMessage`` if ``value`` (encoded as ``data``) holds a NaN or an
    infinite float: JSON has no such numbers, and orjson writes them as null, so the value
    would come back changed without a word. (A look only when ``data`` holds a null.)"""
    if b"null" in data and _non_finite(value):
        raise InvalidMessage(
            f"{what} cannot hold NaN or infinite floats (JSON has no such numbers; they "
            "would come back as None)"
        )


def _non_finite(value: object) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_non_finite(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(_non_finite(getattr(value, f.name)) for f in dataclasses.fields(value))
    return False


def encode_result(result: object) -> bytes | None:
    """The stored form of a claim's result: None stays None, bytes are kept as they are,
    anything else must be JSON-serialisable (``InvalidMessage`` otherwise)."""
    if result is None:
        return None
    if isinstance(result, bytes | bytearray | memoryview):
        return _BYTES + bytes(result)
    try:
        data = orjson.dumps(result)
    except TypeError as exc:
        raise InvalidMessage(
            f"cannot store a result of type {type(result).__name__}: use bytes or a "
            f"JSON-serialisable value ({exc})"
        ) from exc
    _check_finite(result, data, "a result")
    return _JSON + data


def decode_result(raw: bytes | None) -> Any:
    """The inverse of :func:`encode_result`."""
    if raw is None:
        return None
    tag, payload = raw[:1], raw[1:]
    if tag == _BYTES:
        return payload
    if tag == _JSON:
        return orjson.loads(payload)
    raise InvalidMessage(f"unknown stored result format {tag!r}")


def check_version(version: object) -> Version:
    """A version a gate can compare: an int (64-bit), a finite float, or a timezone-aware
    ``datetime`` (an event time, turned into seconds since the epoch)."""
    if isinstance(version, datetime):
        if version.tzinfo is None or version.utcoffset() is None:
            raise InvalidOption(
                f"an event-time version needs a timezone-aware datetime, got {version!r}"
            )
        return version.timestamp()
    if isinstance(version, bool) or not isinstance(version, int | float):
        raise InvalidOption(
            f"a version must be an int, a float or an aware datetime, got {version!r}"
        )
    if isinstance(version, int):
        if not -_INT64 <= version < _INT64:
            raise InvalidOption(f"an integer version must fit in 64 bits, got {version!r}")
        return version
    if not math.isfinite(version):
        raise InvalidOption(f"a version must be finite, got {version!r}")
    return version


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    """What a store holds for one key: ``state`` is ``"running"`` while a claim holds it
    (until ``expires_at``, the end of the lease) and ``"completed"`` once done (kept until
    ``expires_at``, the end of the ttl). ``fingerprint`` is what the claimer said the work
    was (the HTTP middleware's request hash), ``raw`` the stored result."""

    key: str
    state: Literal["running", "completed"]
    expires_at: float
    fingerprint: str | None = None
    raw: bytes | None = None

    @property
    def completed(self) -> bool:
        """True once the work behind the key was done (and is not to be done again)."""
        return self.state == "completed"

    @property
    def running(self) -> bool:
        """True while a claimer holds the key."""
        return self.state == "running"

    @property
    def result(self) -> Any:
        """The result given to :meth:`Claim.complete` (None while running)."""
        return decode_result(self.raw)
