"""The dashboard's login session: a signed, expiring cookie bound to an API key's id.

``POST /login`` with an admin key sets the cookie ``fairq_session`` to::

    v1.<key id>.<expires>.<nonce>.<mac>

* ``key id`` — an HMAC of the key under the server's session secret (12 bytes, base64url):
  it names the key without giving it away, and a session whose key is no longer in
  ``FAIRQ_API_KEYS`` (or no longer has the ``admin`` scope) is refused, so removing a key
  revokes its sessions;
* ``expires`` — seconds since the epoch; a session past it is refused (default lifetime
  12 hours, ``--session-ttl``);
* ``nonce`` — 128 random bits, so that two logins never make the same cookie, and so that
  ``POST /logout`` can revoke this one session (remembered by this process until it would
  have expired);
* ``mac`` — HMAC-SHA256 under the session secret of everything before it; a cookie that was
  altered or made without the secret is refused.

A stolen cookie is therefore worth a bounded time of dashboard access, not the key: it
cannot be turned back into the key, it ends at its expiry, at logout, when its key is
removed, and when the secret changes. The secret comes from ``FAIRQ_SESSION_SECRET``
(read by the CLI; share it between processes behind one name, keep it to let sessions
survive restarts); without it each server start draws one, so a restart logs everyone out.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

from ..errors import InvalidOption
from .auth import ApiKey, KeyRing

__all__ = ["SESSION_TTL", "Sessions"]

#: the default lifetime of a dashboard session, in seconds
SESSION_TTL = 12 * 3600.0
_VERSION = "v1"
_MAX_REVOKED = 100_000  # logouts remembered at once; past it the oldest are forgotten


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class Sessions:
    """Issues and checks dashboard session cookies (see the module docstring).

    ``secret``: at least 16 bytes (a str is UTF-8 encoded); None draws 32 random bytes.
    ``ttl``: seconds a session lasts. ``clock``: seconds since the epoch.
    """

    def __init__(
        self,
        secret: bytes | str | None = None,
        ttl: float = SESSION_TTL,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if isinstance(secret, str):
            secret = secret.encode()
        if secret is None:
            secret = secrets.token_bytes(32)
        if len(secret) < 16:
            raise InvalidOption("the session secret must be at least 16 bytes long")
        if not ttl > 0:
            raise InvalidOption(f"the session lifetime must be > 0 seconds, got {ttl!r}")
        self._secret = hashlib.sha256(b"fairq dashboard session\0" + secret).digest()
        self.ttl = float(ttl)
        self.clock = clock
        self._revoked: dict[str, float] = {}  # nonce -> when its session would expire

    def key_id(self, key: ApiKey) -> str:
        """The id a session carries for ``key``: it names the key, never reveals it."""
        mac = hmac.new(self._secret, b"key id\0" + key.key.encode(), hashlib.sha256)
        return _b64(mac.digest()[:12])

    def _mac(self, payload: str) -> str:
        return _b64(hmac.new(self._secret, payload.encode(), hashlib.sha256).digest())

    def issue(self, key: ApiKey) -> str:
        """A new session cookie value for ``key``, valid for ``ttl`` seconds."""
        expires = int(self.clock() + self.ttl)
        payload = f"{_VERSION}.{self.key_id(key)}.{expires}.{_b64(secrets.token_bytes(16))}"
        return f"{payload}.{self._mac(payload)}"

    def _parts(self, value: str) -> tuple[str, int, str] | None:
        """``(key id, expires, nonce)`` of a well-signed session, else None."""
        payload, _, mac = value.rpartition(".")
        parts = payload.split(".")
        if len(parts) != 4 or parts[0] != _VERSION:
            return None
        if not hmac.compare_digest(mac.encode(), self._mac(payload).encode()):
            return None
        _, kid, expires_text, nonce = parts
        if not expires_text.isdigit():
            return None
        return kid, int(expires_text), nonce

    def verify(self, value: str | None, keys: KeyRing) -> ApiKey | None:
        """The admin key of a valid session cookie, or None: not signed by this secret,
        expired, logged out, or its key no longer configured with the ``admin`` scope."""
        if not value or len(value) > 512:
            return None
        parts = self._parts(value)
        if parts is None:
            return None
        kid, expires, nonce = parts
        if expires <= self.clock() or nonce in self._revoked:
            return None
        match = None
        for key in keys.keys:  # every key compared, in constant time
            if hmac.compare_digest(self.key_id(key).encode(), kid.encode()) and match is None:
                match = key
        if match is None or "admin" not in match.scopes:
            return None
        return match

    def revoke(self, value: str | None) -> None:
        """Refuse this session from now on (logout), in this process."""
        parts = self._parts(value or "")
        if parts is None:
            return
        _, expires, nonce = parts
        now = self.clock()
        if expires <= now:
            return
        if len(self._revoked) >= _MAX_REVOKED:
            self._revoked = {n: t for n, t in self._revoked.items() if t > now}
            while len(self._revoked) >= _MAX_REVOKED:
                self._revoked.pop(next(iter(self._revoked)))
        self._revoked[nonce] = expires
