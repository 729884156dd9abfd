"""API keys and scopes of ``fairq serve``.

Keys come from ``FAIRQ_API_KEYS`` (read by the CLI only), written as::

    FAIRQ_API_KEYS="k_9Qx...Zt:admin, k_f3...Lw:send+receive, k_p0...aa:receive"

entries separated by commas or newlines, each ``KEY:SCOPE[+SCOPE...]``. A key is 16 to
256 characters from ``A-Z a-z 0-9 _ - . ~`` (``python -c "import secrets;
print(secrets.token_urlsafe(24))"`` makes one). Scopes:

* ``admin`` — everything: declare, delete, purge, redrive, subscribe, plans and states,
  the dashboard, and what the other scopes allow;
* ``send`` — send to queues, publish to topics and attention keys;
* ``receive`` — receive, ack, nack, extend, dead-letter, peek, stream a topic.

Any valid key may read lists, stats and ``/metrics``. A request presents its key as
``Authorization: Bearer KEY`` (or ``X-API-Key: KEY``); the dashboard logs in with an admin
key at ``POST /login`` and gets a signed, expiring session cookie bound to that key's id
(:mod:`fairq.http.session`) — never the key itself. Keys are compared in constant time
against every configured key (never stopping at the first match).

Without keys the server is open, so it refuses to listen anywhere but loopback
(:func:`check_bind`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..errors import InvalidOption
from .errors import ApiError

if TYPE_CHECKING:
    from .session import Sessions

__all__ = [
    "COOKIE",
    "SCOPES",
    "ApiKey",
    "KeyRing",
    "Principal",
    "Scope",
    "check_bind",
    "is_loopback",
    "parse_api_keys",
]

Scope = Literal["admin", "send", "receive", "read", "public"]
#: scopes a key can hold ("read": any valid key; "public": no key at all)
SCOPES: tuple[str, ...] = ("admin", "send", "receive")
#: the dashboard's session cookie (a signed session, :mod:`fairq.http.session`)
COOKIE = "fairq_session"
_KEY = re.compile(r"[A-Za-z0-9_.~-]{16,256}")


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One configured key and its scopes."""

    key: str
    scopes: frozenset[str]

    @property
    def label(self) -> str:
        """A name for logs that does not give the key away."""
        return f"{self.key[:4]}…{hashlib.sha256(self.key.encode()).hexdigest()[:8]}"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who made a request: the key's label and scopes (``anonymous`` when auth is off)."""

    label: str
    scopes: frozenset[str]

    def allows(self, scope: Scope) -> bool:
        return scope in ("read", "public") or "admin" in self.scopes or scope in self.scopes


ANONYMOUS = Principal("anonymous", frozenset(SCOPES))


def parse_api_keys(text: str) -> list[ApiKey]:
    """Parse the ``FAIRQ_API_KEYS`` format; raise ``InvalidOption`` naming the bad entry
    (showing only the start of a key)."""
    keys: list[ApiKey] = []
    seen: set[str] = set()
    for raw in re.split(r"[,\n]", text):
        entry = raw.strip()
        if not entry:
            continue
        key, sep, scopes_text = entry.rpartition(":")
        shown = f"{entry[:4]}…" if len(entry) > 4 else entry
        if not sep or not key:
            raise InvalidOption(
                f"API key entry {shown!r} has no scopes: write KEY:SCOPE[+SCOPE], "
                f"scopes {', '.join(SCOPES)}"
            )
        if _KEY.fullmatch(key) is None:
            raise InvalidOption(
                f"API key {shown!r} must be 16-256 characters from A-Z a-z 0-9 _ - . ~"
            )
        scopes = frozenset(s.strip() for s in scopes_text.split("+"))
        unknown = scopes - set(SCOPES)
        if unknown or not scopes:
            raise InvalidOption(
                f"API key {shown!r}: unknown scope(s) {', '.join(sorted(unknown)) or '(none)'}"
                f" (known: {', '.join(SCOPES)})"
            )
        if key in seen:
            raise InvalidOption(f"API key {shown!r} is listed twice")
        seen.add(key)
        keys.append(ApiKey(key, scopes))
    return keys


class KeyRing:
    """The configured keys; :meth:`authenticate` finds a request's principal."""

    def __init__(self, keys: Iterable[ApiKey] = ()) -> None:
        self._keys = [(k.key.encode(), k) for k in keys]

    @classmethod
    def parse(cls, text: str | None) -> KeyRing:
        return cls(parse_api_keys(text or ""))

    @property
    def keys(self) -> tuple[ApiKey, ...]:
        """The configured keys."""
        return tuple(k for _, k in self._keys)

    @property
    def enabled(self) -> bool:
        """False when no key is configured: every request is allowed."""
        return bool(self._keys)

    def find(self, presented: str | None) -> ApiKey | None:
        """The key equal to ``presented``, compared in constant time with every key."""
        if presented is None:
            return None
        given = presented.encode("utf-8", "replace")
        match = None
        for raw, key in self._keys:
            if hmac.compare_digest(raw, given) and match is None:
                match = key
        return match

    def authenticate(
        self,
        headers: Mapping[str, str],
        cookies: Mapping[str, str],
        sessions: Sessions | None = None,
    ) -> Principal:
        """The principal of a request — its key from the headers, else its dashboard
        session cookie checked by ``sessions``; ``ApiError`` 401 without either."""
        if not self._keys:
            return ANONYMOUS
        presented = _presented(headers)
        if presented is None:
            session = cookies.get(COOKIE)
            if session and sessions is not None:
                found = sessions.verify(session, self)
                if found is not None:
                    return Principal(found.label, found.scopes)
                raise ApiError(401, "unauthorized", "the dashboard session has ended: log in again")
            raise ApiError(
                401,
                "unauthorized",
                "this server needs an API key: send 'Authorization: Bearer KEY'",
            )
        key = self.find(presented)
        if key is None:
            raise ApiError(401, "unauthorized", "unknown API key")
        return Principal(key.label, key.scopes)


def _presented(headers: Mapping[str, str]) -> str | None:
    """The key a request's headers present ("" for a malformed one), None if none."""
    auth = headers.get("authorization")
    if auth is not None:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return ""  # a malformed header never falls back to the cookie
    key = headers.get("x-api-key")
    if key is not None:
        return key.strip()
    return None


def require(principal: Principal, scope: Scope) -> None:
    """Raise ``ApiError`` 403 unless ``principal`` holds ``scope``."""
    if not principal.allows(scope):
        raise ApiError(
            403,
            "forbidden",
            f"this API key lacks the {scope!r} scope (it has: "
            f"{', '.join(sorted(principal.scopes)) or 'none'})",
        )


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and the loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, keys: KeyRing) -> None:
    """Raise ``InvalidOption`` explaining why an open server must stay on loopback."""
    if keys.enabled or is_loopback(host):
        return
    raise InvalidOption(
        f"refusing to listen on {host}: no API keys are set, so anyone who can reach this "
        "address could read, send and delete every message. Set FAIRQ_API_KEYS (for example "
        "FAIRQ_API_KEYS='<key>:admin', see docs/server.md) or listen on 127.0.0.1."
    )
